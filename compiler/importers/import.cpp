// Format detection, file reading and the helpers shared by the readers.
#include <fstream>
#include <sstream>

#include "compiler/importers/common.hpp"

namespace mk::importers {

namespace detail {

void rotate_to_root0(ir::Schedule& s, int32_t root) {
  if (root == 0) return;
  auto rot = [&](int32_t r) { return ((r - root) % s.nranks + s.nranks) % s.nranks; };
  for (ir::Op& op : s.ops) {
    op.rank = rot(op.rank);
    if (op.kind == ir::OpKind::signal) op.peer = rot(op.peer);
    for (auto* list : {&op.srcs, &op.dsts})
      for (ir::Ref& r : *list) r.rank = rot(r.rank);
  }
  s.root = 0;
}

void rethrow_in_reading(const Error& e, const std::string& reading, const std::string& why) {
  throw Error(e.id(), why + ": " + e.message(), e.loc(),
              e.hint().empty() ? "declare only the use the algorithm supports (inplace / outofplace)"
                               : e.hint() + "; or declare only the use the algorithm supports (" + reading +
                                     " is the failing one)");
}

}  // namespace detail

namespace {

std::string_view trim_front(std::string_view t) {
  if (t.size() >= 3 && t.substr(0, 3) == "\xEF\xBB\xBF") t.remove_prefix(3);
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t' || t.front() == '\n' || t.front() == '\r'))
    t.remove_prefix(1);
  return t;
}

bool ends_with(const std::string& s, std::string_view suf) {
  if (s.size() < suf.size()) return false;
  for (size_t i = 0; i < suf.size(); ++i) {
    char a = s[s.size() - suf.size() + i];
    if (a >= 'A' && a <= 'Z') a = char(a - 'A' + 'a');
    if (a != suf[i]) return false;
  }
  return true;
}

// An IR JSON carries "mk_ir_version" near the top; MSCCL++ plans do not.
bool looks_like_ir(std::string_view t) { return t.find("\"mk_ir_version\"") != std::string_view::npos; }

}  // namespace

Format detect_format(std::string_view text, const std::string& file_name) {
  std::string_view t = trim_front(text);
  const bool xml_ext = ends_with(file_name, ".xml");
  const bool json_ext = ends_with(file_name, ".json");
  if (xml_ext || (!json_ext && !t.empty() && t.front() == '<')) return Format::msccl_xml;
  if (json_ext || (!t.empty() && t.front() == '{')) return looks_like_ir(t) ? Format::mk_ir_json : Format::mscclpp_json;
  throw Error(ErrId::import_E013,
              "'" + file_name + "' is neither MSCCL XML (.xml, starts with '<') nor JSON (.json, starts with '{')",
              {}, "mkc reads MSCCL XML algorithms, MSCCL++ execution plans and mKernel IR JSON");
}

ir::Schedule import_text(std::string_view text, const std::string& file_name, ImportInfo* info,
                         const ImportOptions& opt) {
  switch (detect_format(text, file_name)) {
    case Format::msccl_xml: return import_msccl_xml(text, file_name, info, opt);
    case Format::mscclpp_json: return import_mscclpp_json(text, file_name, info, opt);
    case Format::mk_ir_json: {
      ir::Schedule s = ir::from_json(text);
      if (s.synced || s.staged)
        throw Error(ErrId::import_E010,
                    "'" + file_name + "' holds a lowered schedule (after stage/sync); mkc takes raw schedules",
                    {}, "write the raw IR with `mkc import -o` or `mkc lower --dump-after=build --emit=json`");
      for (const ir::Op& op : s.ops)
        if (!op.is_data() && op.kind != ir::OpKind::nop)
          throw Error(ErrId::import_E010,
                      "'" + file_name + "' has " + std::string(ir::name(op.kind)) +
                          " ops; a raw schedule has copy and reduce ops only",
                      op.loc);
      if (info) {
        *info = ImportInfo{};
        info->format = "mk-ir-json";
        info->name = s.name;
        info->reading = "both (mKernel IR)";
        info->inplace = info->outofplace = true;
        info->steps = int32_t(s.ops.size());
      }
      return s;
    }
  }
  return {};
}

ir::Schedule import_file(const std::string& path, ImportInfo* info, const ImportOptions& opt) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw Error(ErrId::cli_E009, "cannot read '" + path + "'", {}, "check the path and its permissions");
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(ErrId::cli_E009, "error while reading '" + path + "'");
  return import_text(ss.str(), path, info, opt);
}

}  // namespace mk::importers
