// Line numbers for JSON values. nlohmann::json does not keep source
// positions, so this scanner walks the raw text once and records, for every
// object and array, the JSON path it sits at ("$.gpus[0].threadblocks[1].ops[3]")
// and the 1-based line of its opening bracket. Importers use it to point
// errors and IR ops (Op::loc) at the user's file.
//
// Contract: never reads outside the text, never recurses, linear time, and
// tolerates any input (on malformed JSON the table is simply incomplete; the
// JSON parser reports the syntax error). `max_depth()` is the deepest nesting
// seen, so callers can refuse absurd nesting before handing the text to a
// parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace mk::importers {

class JsonLines {
 public:
  explicit JsonLines(std::string_view text);
  // Line of the object/array at `path`, or 0 when unknown.
  uint32_t line(const std::string& path) const;
  int max_depth() const { return max_depth_; }
  // The first key that appears twice in one object ("" if none), as the
  // path of the second occurrence, and its line.
  const std::string& duplicate_key() const { return dup_path_; }
  uint32_t duplicate_line() const { return dup_line_; }

  // How a path extends with a key or an index (the same spelling the scanner
  // records): .key for identifier-like keys, ["key"] otherwise; [i].
  static std::string key(const std::string& path, std::string_view k);
  static std::string index(const std::string& path, size_t i);

 private:
  std::unordered_map<std::string, uint32_t> lines_;
  int max_depth_ = 0;
  std::string dup_path_;
  uint32_t dup_line_ = 0;
};

}  // namespace mk::importers
