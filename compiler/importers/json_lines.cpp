#include "compiler/importers/json_lines.hpp"

#include <set>
#include <vector>

namespace mk::importers {
namespace {

// Paths are recorded for the first kTrackDepth levels only: deeper nesting
// would cost quadratic memory (every path repeats its parent) and no
// algorithm file nests that deep; depth is still counted.
constexpr int kTrackDepth = 48;

bool identifier(std::string_view k) {
  if (k.empty() || k.size() > 64) return false;
  for (size_t i = 0; i < k.size(); ++i) {
    char c = k[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

struct Frame {
  bool array = false;
  size_t index = 0;
  std::string path;
  std::string key;       // object: the key of the value being read
  bool have_key = false;  // object: a key string was seen since the last ',' or '{'
  std::set<std::string> keys;
};

}  // namespace

std::string JsonLines::key(const std::string& path, std::string_view k) {
  if (identifier(k)) return path + "." + std::string(k);
  std::string out = path + "[\"";
  for (char c : k.substr(0, 64)) out += (c == '"' || c == '\\') ? '_' : c;
  return out + "\"]";
}

std::string JsonLines::index(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

JsonLines::JsonLines(std::string_view t) {
  std::vector<Frame> stack;
  int untracked = 0;  // open containers deeper than kTrackDepth
  uint32_t line = 1;
  size_t i = 0;
  auto value_path = [&]() -> std::string {
    if (stack.empty()) return "$";
    const Frame& f = stack.back();
    if (f.array) return index(f.path, f.index);
    return key(f.path, f.have_key ? std::string_view(f.key) : std::string_view("?"));
  };
  while (i < t.size()) {
    char c = t[i];
    if (c == '\n') {
      ++line;
      ++i;
      continue;
    }
    if (c == '"') {
      // a string: a key when an object expects one, else a value
      size_t start = ++i;
      while (i < t.size() && t[i] != '"') {
        if (t[i] == '\\') {
          ++i;  // skip the escaped character (never a newline in valid JSON)
          if (i < t.size() && t[i] == '\n') ++line;
        } else if (t[i] == '\n') {
          ++line;
        }
        if (i < t.size()) ++i;
      }
      std::string_view s = t.substr(start, (i < t.size() ? i : t.size()) - start);
      if (i < t.size()) ++i;  // closing quote
      if (untracked == 0 && !stack.empty() && !stack.back().array && !stack.back().have_key) {
        Frame& f = stack.back();
        f.key = std::string(s.substr(0, 256));
        f.have_key = true;
        if (!f.keys.insert(f.key).second && dup_path_.empty()) {
          dup_path_ = key(f.path, f.key);
          dup_line_ = line;
        }
      }
      continue;
    }
    if (c == '{' || c == '[') {
      int depth = int(stack.size()) + untracked + 1;
      if (depth > max_depth_) max_depth_ = depth;
      if (untracked > 0 || int(stack.size()) >= kTrackDepth) {
        ++untracked;
      } else {
        std::string p = value_path();
        lines_.emplace(p, line);
        Frame f;
        f.array = c == '[';
        f.path = std::move(p);
        stack.push_back(std::move(f));
      }
      ++i;
      continue;
    }
    if (c == '}' || c == ']') {
      if (untracked > 0)
        --untracked;
      else if (!stack.empty())
        stack.pop_back();
      ++i;
      continue;
    }
    if (c == ',') {
      if (untracked == 0 && !stack.empty()) {
        Frame& f = stack.back();
        if (f.array)
          ++f.index;
        else
          f.have_key = false;
      }
      ++i;
      continue;
    }
    ++i;
  }
}

uint32_t JsonLines::line(const std::string& path) const {
  auto it = lines_.find(path);
  return it == lines_.end() ? 0 : it->second;
}

}  // namespace mk::importers
