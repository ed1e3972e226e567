// A small XML reader for the subset that algorithm files use: elements,
// attributes (quoted with ' or "), self-closing tags, comments, <?xml ...?>
// declarations and a simple <!DOCTYPE ...>, and the character entities
// &lt; &gt; &amp; &quot; &apos; &#N; &#xH;.
//
// Contract: parse() never reads outside `text`, never recurses (an explicit
// stack, depth at most kMaxDepth) and runs in time linear in the input. Any
// input that is not such a document throws mk::Error(import_E001) naming the
// file and line; input over the limits throws import_E012. Text content
// between elements is not part of this subset: non-blank text is an error
// (the MSCCL runtime rejects it too), so nothing is silently dropped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mk::importers::xml {

inline constexpr int kMaxDepth = 64;
inline constexpr size_t kMaxBytes = size_t(256) << 20;  // 256 MiB

struct Attr {
  std::string name, value;
  uint32_t line = 0;
};

struct Element {
  std::string name;
  uint32_t line = 0;  // line of the '<' that opens it
  std::vector<Attr> attrs;
  std::vector<Element> children;

  // nullptr when absent
  const Attr* attr(std::string_view n) const;
};

// Parses a document with exactly one root element. `file` names the input
// in error messages.
Element parse(std::string_view text, const std::string& file);

}  // namespace mk::importers::xml
