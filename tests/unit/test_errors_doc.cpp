// The error catalogue: ids print and parse, and docs/errors.md has exactly one
// section per id in include/mk/errors.def, each saying what to do.
#include <doctest/doctest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "mk/error.hpp"
#include "support.hpp"

using namespace mk;
using mkt::contains;

namespace {

std::vector<ErrId> all_ids() {
  std::vector<ErrId> v;
  for (int i = 0; i < int(ErrId::count_); ++i) v.push_back(ErrId(i));
  return v;
}

// "### mk.x.Eyyy" heading -> the section's text (up to the next heading)
std::map<std::string, std::string> doc_sections() {
  const std::string text = mkt::read_text(mkt::fs::path(mkt::test_dir()).parent_path() / "docs" / "errors.md");
  REQUIRE_MESSAGE(!text.empty(), "docs/errors.md is missing");
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line, current;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0 || line.rfind("### ", 0) == 0) current.clear();
    if (line.rfind("### mk.", 0) == 0) {
      current = line.substr(4);
      CHECK_MESSAGE(out.count(current) == 0, "two sections for " << current);
      out[current] = "";
      continue;
    }
    if (!current.empty()) out[current] += line + "\n";
  }
  return out;
}

}  // namespace

TEST_CASE("errors: every id prints as mk.<domain>.E<nnn> and parses back") {
  std::set<std::string> names;
  const std::regex form("mk\\.(dsl|verify|ir|jit|plan|cli|import)\\.E[0-9]{3}");
  for (ErrId id : all_ids()) {
    const std::string n = err_name(id);
    CAPTURE(n);
    CHECK(std::regex_match(n, form));
    CHECK(names.insert(n).second);
    CHECK(!err_summary(id).empty());
    ErrId back{};
    REQUIRE(err_parse(n, &back));
    CHECK(back == id);
    REQUIRE(err_parse(n.substr(3), &back));  // "verify.E001" works too
    CHECK(back == id);
  }
  ErrId x{};
  CHECK_FALSE(err_parse("mk.verify.E999", &x));
  CHECK_FALSE(err_parse("verify", &x));
  CHECK_FALSE(err_parse("", &x));
  // numbering is dense per domain: E001, E002, ... with no gaps
  std::map<std::string, int> last;
  for (const auto& n : names) {
    const std::string dom = n.substr(3, n.rfind('.') - 3);
    const int num = std::stoi(n.substr(n.rfind('E') + 1));
    CHECK_MESSAGE(num == last[dom] + 1, n << " follows E" << last[dom]);
    last[dom] = num;
  }
}

TEST_CASE("errors: mk::Error renders id, message, location and hint") {
  Error e(ErrId::verify_E012, "nothing here", SrcLoc{"/a/b/sched.cpp", 42, "f"}, "do this");
  CHECK(std::string(e.what()) == "[mk.verify.E012] nothing here\n  at /a/b/sched.cpp:42\n  hint: do this");
  CHECK(e.loc().str() == "sched.cpp:42");
  CHECK(e.message() == "nothing here");
  CHECK(e.hint() == "do this");
  Error plain(ErrId::cli_E001, "x");
  CHECK(std::string(plain.what()) == "[mk.cli.E001] x");
  CHECK_FALSE(plain.loc().valid());
  CHECK(plain.loc().str().empty());
  InternalError ie("broken");
  CHECK(contains(ie.what(), "mKernel internal error: broken"));
}

TEST_CASE("errors: docs/errors.md has one section per id, each saying what it means and what to do") {
  const auto sections = doc_sections();
  std::set<std::string> ids;
  for (ErrId id : all_ids()) {
    const std::string n = err_name(id);
    ids.insert(n);
    CAPTURE(n);
    auto it = sections.find(n);
    REQUIRE_MESSAGE(it != sections.end(), "docs/errors.md has no '### " << n << "' section");
    // the first paragraph starts with the catalogue's summary, in bold
    CHECK(contains(it->second, "**" + std::string(err_summary(id)) + ".**"));
    CHECK(contains(it->second, "What to do:"));
  }
  for (const auto& [n, text] : sections) {
    CAPTURE(n);
    CHECK_MESSAGE(ids.count(n) == 1, "docs/errors.md documents " << n << ", which errors.def does not define");
  }
}
