// The XML subset reader (see xml.hpp). A cursor walks the text once; every
// access goes through at()/peek(), which return '\0' past the end, so a
// truncated document reaches the "unexpected end" checks instead of reading
// out of bounds.
#include "compiler/importers/xml.hpp"

#include <fmt/format.h>

#include "mk/error.hpp"

namespace mk::importers::xml {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (static_cast<unsigned char>(c) >= 0x80);
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
}

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f)
      out += fmt::format("\\x{:02x}", u);
    else
      out += c;
  }
  if (s.size() > 40) out += "...";
  return out;
}

class Reader {
 public:
  Reader(std::string_view text, const std::string& file) : t_(text), file_(file) {}

  Element run() {
    if (t_.size() > kMaxBytes)
      throw Error(ErrId::import_E012,
                  fmt::format("{}: {} bytes is larger than the {} MiB an algorithm file may have", file_,
                              t_.size(), kMaxBytes >> 20));
    // UTF-8 byte order mark
    if (t_.size() >= 3 && t_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    std::vector<Element> stack;
    bool have_root = false;
    Element root;
    while (true) {
      skip_space_and_text(stack.empty(), have_root);
      if (pos_ >= t_.size()) break;
      // at '<'
      if (starts("<!--")) {
        skip_comment();
        continue;
      }
      if (starts("<?")) {
        skip_pi();
        continue;
      }
      if (starts("<![CDATA[")) fail("CDATA sections are not part of an algorithm file");
      if (starts("<!")) {
        if (have_root || !stack.empty()) fail("<!DOCTYPE> is only allowed before the root element");
        skip_doctype();
        continue;
      }
      if (starts("</")) {
        uint32_t line = line_;
        pos_ += 2;
        std::string name = read_name("closing tag");
        skip_space();
        expect('>', "'>' to end the closing tag </" + name);
        if (stack.empty()) fail_at(line, fmt::format("closing tag </{}> without an opening tag", name));
        if (stack.back().name != name)
          fail_at(line, fmt::format("closing tag </{}> does not match <{}> opened on line {}", name,
                                    stack.back().name, stack.back().line));
        Element done = std::move(stack.back());
        stack.pop_back();
        if (stack.empty()) {
          root = std::move(done);
          have_root = true;
        } else {
          stack.back().children.push_back(std::move(done));
        }
        continue;
      }
      // an opening tag
      if (have_root && stack.empty()) fail("a second root element: an algorithm file has exactly one");
      Element e;
      e.line = line_;
      ++pos_;  // '<'
      e.name = read_name("element name");
      bool self_closing = false;
      while (true) {
        bool had_space = skip_space();
        char c = at(pos_);
        if (c == '\0' && pos_ >= t_.size()) fail_at(e.line, fmt::format("<{}> is not closed: the file ends", e.name));
        if (c == '/') {
          ++pos_;
          expect('>', fmt::format("'>' after '/' in <{}", e.name));
          self_closing = true;
          break;
        }
        if (c == '>') {
          ++pos_;
          break;
        }
        if (!had_space) fail(fmt::format("expected a space, '>' or '/>' in <{}>, got '{}'", e.name, printable(t_.substr(pos_, 1))));
        Attr a;
        a.line = line_;
        a.name = read_name(fmt::format("attribute name in <{}>", e.name));
        skip_space();
        expect('=', fmt::format("'=' after attribute {} in <{}>", a.name, e.name));
        skip_space();
        a.value = read_value(a.name);
        for (const Attr& o : e.attrs)
          if (o.name == a.name) fail_at(a.line, fmt::format("attribute {} appears twice in <{}>", a.name, e.name));
        e.attrs.push_back(std::move(a));
      }
      if (self_closing) {
        if (stack.empty()) {
          root = std::move(e);
          have_root = true;
        } else {
          stack.back().children.push_back(std::move(e));
        }
      } else {
        if (int(stack.size()) >= kMaxDepth)
          throw Error(ErrId::import_E012,
                      fmt::format("elements are nested more than {} deep", kMaxDepth), loc(e.line));
        stack.push_back(std::move(e));
      }
    }
    if (!stack.empty())
      fail_at(stack.back().line,
              fmt::format("<{}> is not closed: the file ends (truncated?)", stack.back().name));
    if (!have_root) fail("no element found: expected an <algo> element");
    return root;
  }

 private:
  char at(size_t i) const { return i < t_.size() ? t_[i] : '\0'; }
  bool starts(std::string_view s) const { return t_.size() - pos_ >= s.size() && t_.substr(pos_, s.size()) == s; }

  SrcLoc loc(uint32_t line) const { return SrcLoc{file_, line, {}}; }
  [[noreturn]] void fail(const std::string& what) const { fail_at(line_, what); }
  [[noreturn]] void fail_at(uint32_t line, const std::string& what) const {
    throw Error(ErrId::import_E001, "malformed XML: " + what, loc(line),
                "an MSCCL algorithm is one <algo> element holding <gpu>, <tb> and <step> elements");
  }

  void advance() {
    if (t_[pos_] == '\n') ++line_;
    ++pos_;
  }

  bool skip_space() {
    size_t start = pos_;
    while (pos_ < t_.size() && is_space(t_[pos_])) advance();
    return pos_ != start;
  }

  // Between tags: whitespace only.
  void skip_space_and_text(bool outside_root, bool have_root) {
    skip_space();
    if (pos_ < t_.size() && t_[pos_] != '<') {
      size_t end = pos_;
      while (end < t_.size() && t_[end] != '<' && end - pos_ < 40) ++end;
      fail(fmt::format("unexpected text '{}'{}", printable(t_.substr(pos_, end - pos_)),
                       outside_root && have_root ? " after the root element" : ""));
    }
  }

  void expect(char c, const std::string& what) {
    if (pos_ >= t_.size()) fail("the file ends; expected " + what);
    if (t_[pos_] != c) fail(fmt::format("expected {}, got '{}'", what, printable(t_.substr(pos_, 1))));
    advance();
  }

  std::string read_name(const std::string& what) {
    if (pos_ >= t_.size()) fail("the file ends; expected " + what);
    if (!is_name_start(t_[pos_])) fail(fmt::format("expected {}, got '{}'", what, printable(t_.substr(pos_, 1))));
    size_t start = pos_;
    while (pos_ < t_.size() && is_name_char(t_[pos_])) ++pos_;
    if (pos_ - start > 256) fail(what + " is longer than 256 characters");
    return std::string(t_.substr(start, pos_ - start));
  }

  std::string read_value(const std::string& attr) {
    char q = at(pos_);
    if (q != '"' && q != '\'') {
      if (pos_ >= t_.size()) fail("the file ends; expected the value of " + attr);
      fail(fmt::format("the value of {} must be quoted with \" or ', got '{}'", attr, printable(t_.substr(pos_, 1))));
    }
    uint32_t start_line = line_;
    ++pos_;
    std::string v;
    while (true) {
      if (pos_ >= t_.size()) fail_at(start_line, fmt::format("the value of {} is not closed: the file ends", attr));
      char c = t_[pos_];
      if (c == q) {
        ++pos_;
        break;
      }
      if (c == '<') fail(fmt::format("'<' inside the value of {} (write &lt;)", attr));
      if (c == '&') {
        append_entity(v);
        continue;
      }
      if (v.size() >= 4096) fail(fmt::format("the value of {} is longer than 4096 characters", attr));
      v += c;
      advance();
    }
    return v;
  }

  void append_entity(std::string& v) {
    size_t semi = pos_ + 1;
    while (semi < t_.size() && semi - pos_ <= 12 && t_[semi] != ';') ++semi;
    if (semi >= t_.size() || t_[semi] != ';') fail("'&' does not start an entity (write &amp;)");
    std::string_view ent = t_.substr(pos_ + 1, semi - pos_ - 1);
    if (ent == "lt") v += '<';
    else if (ent == "gt") v += '>';
    else if (ent == "amp") v += '&';
    else if (ent == "quot") v += '"';
    else if (ent == "apos") v += '\'';
    else if (ent.size() >= 2 && ent[0] == '#') {
      uint32_t cp = 0;
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      std::string_view digits = ent.substr(hex ? 2 : 1);
      if (digits.empty() || digits.size() > 8) fail(fmt::format("bad character reference &{};", printable(ent)));
      for (char c : digits) {
        uint32_t d;
        if (c >= '0' && c <= '9') d = uint32_t(c - '0');
        else if (hex && c >= 'a' && c <= 'f') d = uint32_t(c - 'a' + 10);
        else if (hex && c >= 'A' && c <= 'F') d = uint32_t(c - 'A' + 10);
        else fail(fmt::format("bad character reference &{};", printable(ent)));
        cp = cp * (hex ? 16 : 10) + d;
      }
      if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        fail(fmt::format("character reference &{}; is not a valid character", printable(ent)));
      append_utf8(v, cp);
    } else {
      fail(fmt::format("unknown entity &{}; (known: &lt; &gt; &amp; &quot; &apos; &#N;)", printable(ent)));
    }
    pos_ = semi + 1;
  }

  static void append_utf8(std::string& v, uint32_t cp) {
    if (cp < 0x80) {
      v += char(cp);
    } else if (cp < 0x800) {
      v += char(0xC0 | (cp >> 6));
      v += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      v += char(0xE0 | (cp >> 12));
      v += char(0x80 | ((cp >> 6) & 0x3F));
      v += char(0x80 | (cp & 0x3F));
    } else {
      v += char(0xF0 | (cp >> 18));
      v += char(0x80 | ((cp >> 12) & 0x3F));
      v += char(0x80 | ((cp >> 6) & 0x3F));
      v += char(0x80 | (cp & 0x3F));
    }
  }

  void skip_until(std::string_view end, const char* what) {
    uint32_t start_line = line_;
    while (pos_ < t_.size()) {
      if (starts(end)) {
        pos_ += end.size();
        return;
      }
      advance();
    }
    fail_at(start_line, std::string(what) + " is not closed: the file ends");
  }

  void skip_comment() {
    pos_ += 4;
    skip_until("-->", "comment <!--");
  }
  void skip_pi() {
    pos_ += 2;
    skip_until("?>", "declaration <?");
  }
  void skip_doctype() {
    uint32_t start_line = line_;
    while (pos_ < t_.size() && t_[pos_] != '>') {
      if (t_[pos_] == '[') fail("<!DOCTYPE> with an internal subset is not supported");
      advance();
    }
    if (pos_ >= t_.size()) fail_at(start_line, "<!DOCTYPE is not closed: the file ends");
    ++pos_;
  }

  std::string_view t_;
  const std::string& file_;
  size_t pos_ = 0;
  uint32_t line_ = 1;
};

}  // namespace

const Attr* Element::attr(std::string_view n) const {
  for (const Attr& a : attrs)
    if (a.name == n) return &a;
  return nullptr;
}

Element parse(std::string_view text, const std::string& file) { return Reader(text, file).run(); }

}  // namespace mk::importers::xml
