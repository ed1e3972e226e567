// MSCCL++ execution-plan JSON -> mKernel IR.
//
// The MSCCL++ executor runs, on every GPU, each threadblocks[i] as one thread
// block executing its ops in order. Data ops read and write memory directly,
// their own GPU's and, through memory/port channels, a peer's (remote
// buffers). Ordering between thread blocks and GPUs comes only from
// signal/wait on a channel (the k-th signal A->B on a channel releases the
// k-th wait at B on the paired channel), barriers between thread blocks of a
// GPU, semaphores (sem_release / sem_acquire), and LL packets, whose reader
// waits for the packet's flag (the write of that packet happens before).
//
// Mapping (algo.hpp does ordering, race proof and emission):
//   put, pws, pwsf, get, copy   -> copy dst := src per (src_buff[i], dst_buff[i]) pair
//   ppkt, rppkt, cpkt, upkt     -> the same; packet slots are scratch chunks
//   re, res, rre, rres          -> reduce dst_buff[*] := op(src_buff[*])
//   repkt, recpkt, respkt, recspkt -> the same (src_buff[1:] are packets)
//   glres (NVLS)                -> reduce every group rank's dst := op(every group rank's src)
//   signal, wait, rlxsignal, rlxwait, barrier, sem_acquire, sem_release
//                               -> ordering only (mKernel derives its own synchronisation)
//   nop, flush                  -> nothing (ordering within the thread block)
//   pipeline                    -> its inner ops, in order, over the whole range
//   tbg_info (thread-block groups) -> each member's slice, exactly: chunks are
//                                  refined by the lcm of the group sizes
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "compiler/importers/common.hpp"
#include "compiler/importers/json_lines.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::importers {

using namespace detail;
using nlohmann::json;

namespace {

const char* kHint = "see docs/import.md for the MSCCL++ execution-plan format mKernel reads";

enum class Ch : uint8_t { memory, port, sw, none };
const char* ch_name(Ch c) {
  switch (c) {
    case Ch::memory: return "memory";
    case Ch::port: return "port";
    case Ch::sw: return "switch";
    case Ch::none: return "none";
  }
  return "?";
}

struct SwitchInfo {
  VBuf buf = VBuf::i;
  std::vector<int32_t> ranks;
};

struct GpuRec {
  const json* j = nullptr;
  std::string path;
  int32_t id = 0;
  int64_t in = 0, out = 0, sc = 0;
  std::vector<int32_t> mem_peer, port_peer;  // gpu-level channels of each type: their peer
  std::vector<SwitchInfo> sw;
  struct Remote {
    int32_t rank;
    VBuf buf;
  };
  std::vector<Remote> remote;
  std::vector<int64_t> sem_init;
};

struct TbRec {
  const json* j = nullptr;
  std::string path;
  int32_t gpu = 0, id = 0, thread = -1;
  std::vector<int32_t> ch[3];  // tb channel index -> gpu channel index, per type (memory, port, switch)
  std::vector<int32_t> rb[2];  // tb buffer index -> gpu remote buffer, per access type (memory, port)
  std::vector<int32_t> node_of_op;  // top-level op index -> node (for old-style deps)
};

struct Action {
  ir::OpKind kind = ir::OpKind::copy;
  std::vector<VRef> dsts, srcs;
};

struct OpRec {
  std::vector<Action> actions;
};

class Reader {
 public:
  Reader(std::string_view text, const std::string& file) : text_(text), file_(file), lines_(text) {}
  ir::Schedule run(ImportInfo* info, const ImportOptions& opt);

 private:
  SrcLoc loc(const std::string& path) const {
    // the line of the innermost enclosing object/array that the scanner knows
    std::string p = path;
    while (true) {
      uint32_t l = lines_.line(p);
      if (l) return SrcLoc{file_, l, path};
      auto cut = p.find_last_of(".[");
      if (cut == std::string::npos || cut == 0) return SrcLoc{file_, 1, path};
      p = p.substr(0, cut);
    }
  }
  [[noreturn]] void fail(ErrId id, const std::string& path, const std::string& what,
                         const std::string& hint = kHint) const {
    throw Error(id, path + ": " + what, loc(path), hint);
  }

  const json& field(const json& o, const char* key, const std::string& path) const {
    if (!o.is_object()) fail(ErrId::import_E002, path, "expected an object");
    auto it = o.find(key);
    if (it == o.end()) fail(ErrId::import_E002, path, fmt::format("missing \"{}\"", key));
    return *it;
  }
  const json* opt_field(const json& o, std::initializer_list<const char*> keys) const {
    for (const char* k : keys) {
      auto it = o.find(k);
      if (it != o.end()) return &*it;
    }
    return nullptr;
  }
  int64_t as_int(const json& v, const std::string& path, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) fail(ErrId::import_E002, path, fmt::format("{} is out of range {}..{}", u, lo, hi));
      x = int64_t(u);
    } else if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else {
      fail(ErrId::import_E002, path, fmt::format("expected an integer, got {}", v.type_name()));
    }
    if (x < lo || x > hi) fail(ErrId::import_E002, path, fmt::format("{} is out of range {}..{}", x, lo, hi));
    return x;
  }
  int64_t get_int(const json& o, std::initializer_list<const char*> keys, const std::string& path, bool required,
                  int64_t dflt, int64_t lo, int64_t hi) const {
    if (!o.is_object()) fail(ErrId::import_E002, path, "expected an object");
    const json* v = opt_field(o, keys);
    if (!v) {
      if (required) fail(ErrId::import_E002, path, fmt::format("missing \"{}\"", *keys.begin()));
      return dflt;
    }
    std::string k;
    for (const char* key : keys)
      if (o.contains(key)) {
        k = key;
        break;
      }
    return as_int(*v, path + "." + k, lo, hi);
  }
  std::string get_str(const json& o, const char* key, const std::string& path) const {
    const json& v = field(o, key, path);
    if (!v.is_string()) fail(ErrId::import_E002, path + "." + key, fmt::format("expected a string, got {}", v.type_name()));
    return v.get<std::string>();
  }
  const json& get_array(const json& o, const char* key, const std::string& path) const {
    const json& v = field(o, key, path);
    if (!v.is_array()) fail(ErrId::import_E002, path + "." + key, fmt::format("expected an array, got {}", v.type_name()));
    return v;
  }
  const json* opt_array(const json& o, std::initializer_list<const char*> keys, const std::string& path) const {
    const json* v = opt_field(o, keys);
    if (v && !v->is_array())
      fail(ErrId::import_E002, path + "." + *keys.begin(), fmt::format("expected an array, got {}", v->type_name()));
    return v;
  }
  VBuf buf_of(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(ErrId::import_E002, path, fmt::format("expected \"i\", \"o\" or \"s\", got {}", v.type_name()));
    std::string s = v.get<std::string>();
    if (s == "i" || s == "input") return VBuf::i;
    if (s == "o" || s == "output") return VBuf::o;
    if (s == "s" || s == "scratch") return VBuf::s;
    fail(ErrId::import_E002, path, fmt::format("buffer type must be \"i\", \"o\" or \"s\", got \"{}\"", s.substr(0, 40)));
  }
  Ch ch_of(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(ErrId::import_E002, path, fmt::format("expected a channel type string, got {}", v.type_name()));
    std::string s = v.get<std::string>();
    if (s == "memory" || s == "sm") return Ch::memory;
    if (s == "port" || s == "proxy") return Ch::port;
    if (s == "switch" || s == "nvls") return Ch::sw;
    if (s == "none") return Ch::none;
    fail(ErrId::import_E002, path,
         fmt::format("channel type must be memory, port, switch or none, got \"{}\"", s.substr(0, 40)));
  }

  void parse_top();
  void parse_gpu(GpuRec& g);
  void parse_tb(GpuRec& g, TbRec& t);
  void parse_ops(GpuRec& g, TbRec& t, const json& ops, const std::string& path, int pipeline_ctx);
  void add_op(GpuRec& g, TbRec& t, const json& op, const std::string& path, int pipeline_ctx);
  void link();
  ir::Schedule emit(bool inplace, int32_t* staging) const;

  // An op's chunk reference: local ({type, index, size}), remote ({buffer_id,
  // ...}, resolved through the thread block's remote_buffer_refs) or switch.
  struct Chunk {
    VRef ref;
    bool remote = false;
  };
  Chunk chunk(const GpuRec& g, const TbRec& t, const json& c, Ch ch, const std::string& path) const;
  VRef slice(VRef r, int64_t tb_id, int64_t tbg) const;

  std::string_view text_;
  const std::string& file_;
  JsonLines lines_;
  json doc_;

  std::string name_, proto_ = "Simple";
  Collective coll_ = Collective::allreduce;
  bool inplace_ = false;
  int32_t ngpus_ = 0, root_ = 0, refine_ = 1;
  int64_t min_bytes_ = 0, max_bytes_ = -1;
  Geometry geo_;
  std::vector<GpuRec> gpus_;
  std::vector<std::vector<TbRec>> tbs_;
  std::vector<OpRec> ops_;
  Graph g_;
  std::vector<std::string> notes_;
  std::set<std::string> ignored_;
  int32_t nops_ = 0, remote_ops_ = 0, sync_edges_ = 0, ntbs_ = 0;

  // synchronisation, collected while reading ops
  struct SigKey {
    int32_t from, to;
    Ch ch;
    int32_t ordinal;
    bool operator<(const SigKey& o) const {
      return std::tie(from, to, ch, ordinal) < std::tie(o.from, o.to, o.ch, o.ordinal);
    }
  };
  std::map<SigKey, std::vector<std::pair<int32_t, int>>> signals_, waits_;  // node, pipeline context
  std::map<std::pair<int32_t, int64_t>, std::vector<std::pair<int32_t, int64_t>>> barriers_;  // (gpu,id) -> (node,n)
  std::map<std::pair<int32_t, int64_t>, std::vector<int32_t>> releases_, acquires_;  // (gpu, sem) -> nodes
  std::map<std::pair<int32_t, int64_t>, int32_t> pkt_writer_;            // (rank, scratch cell) -> node
  std::map<std::pair<int32_t, int64_t>, std::vector<int32_t>> pkt_readers_;
  std::vector<int8_t> scratch_kind_;  // per rank: 0 unused, 1 plain, 2 packet, 3 both
  std::vector<std::pair<std::string, uint32_t>> first_kind_;  // where each rank's first scratch use was
  struct OldDep {
    int32_t gpu, node;
    int64_t tb, step;
    std::string path;
  };
  std::vector<OldDep> old_deps_;
  // Pipelines. MSCCL++ runs a pipeline's inner ops ceil(num_chunks x chunk /
  // unit_size) times, iteration i on bytes [i x unit_size, (i+1) x unit_size)
  // of every range the inner ops name. Its effect is that of one pass over
  // the whole ranges (which is what the importer emits) exactly when the
  // iterations line up: every inner range is num_chunks chunks long, two
  // inner ranges of pipelines with the same iteration space are identical or
  // disjoint (so iteration i of one op meets only iteration i of another),
  // and synchronisation pairs only ops that run equally often. Then
  // happens-before between the ops of one iteration is the same in every
  // iteration (sync edges never go back to an earlier iteration), so the
  // race proof of one pass covers them all. Anything else is refused.
  struct Pipeline {
    std::string path;
    int64_t unit = 0, num = 0;
  };
  std::vector<Pipeline> pipelines_;
  std::map<int32_t, int>
      ctx_of_; // node -> pipeline it runs in (absent: outside any)
  struct PipeRange {
    int64_t unit, num;
    VRef ref;
    std::string path;
  };
  std::vector<PipeRange> pipe_ranges_;
  int ctx(int32_t node) const {
    auto it = ctx_of_.find(node);
    return it == ctx_of_.end() ? -1 : it->second;
  }
  bool same_iterations(int a, int b) const {
    if (a < 0 || b < 0)
      return a == b || (a < 0 && b < 0);
    return pipelines_[size_t(a)].unit == pipelines_[size_t(b)].unit &&
           pipelines_[size_t(a)].num == pipelines_[size_t(b)].num;
  }
  std::string iterations(int c) const {
    if (c < 0)
      return "outside any pipeline (it runs once)";
    const Pipeline &p = pipelines_[size_t(c)];
    return fmt::format("in the pipeline at {} (unit_size {}, num_chunks {}: it "
                       "runs once per iteration)",
                       p.path, p.unit, p.num);
  }
  // Throws import_E010 unless nodes a and b run equally often.
  void same_iterations_or_fail(int32_t a, int32_t b,
                               const std::string &what) const;
  void check_pipeline_ranges() const;
};

void Reader::same_iterations_or_fail(int32_t a, int32_t b,
                                     const std::string &what) const {
  if (same_iterations(ctx(a), ctx(b)))
    return;
  throw Error(ErrId::import_E010,
              fmt::format("{}: {} runs {}, but {} runs {}; the number of times "
                          "they run differs, so the pairing "
                          "breaks (a wait or acquire is left waiting, or a "
                          "signal or release is left over)",
                          what, g_.where(a), iterations(ctx(a)), g_.where(b),
                          iterations(ctx(b))),
              g_.nodes[size_t(b)].loc,
              "put both sides in pipelines with the same unit_size and "
              "num_chunks, or both outside pipelines");
}

void Reader::check_pipeline_ranges() const {
  // Two inner ranges of one iteration space that overlap without being equal
  // meet at different iterations (unit i of one is unit j != i of the other).
  std::vector<const PipeRange *> v;
  for (const PipeRange &r : pipe_ranges_)
    v.push_back(&r);
  auto key = [](const PipeRange *r) {
    return std::tuple(r->unit, r->num, r->ref.rank, int(r->ref.buf),
                      r->ref.index, r->ref.count);
  };
  std::sort(v.begin(), v.end(), [&](const PipeRange *a, const PipeRange *b) {
    return key(a) < key(b);
  });
  const PipeRange *reach = nullptr; // of the ranges so far in this space and
                                    // buffer, the one reaching furthest
  for (const PipeRange *r : v) {
    if (reach &&
        std::tuple(reach->unit, reach->num, reach->ref.rank, reach->ref.buf) ==
            std::tuple(r->unit, r->num, r->ref.rank, r->ref.buf)) {
      const bool equal =
          reach->ref.index == r->ref.index && reach->ref.count == r->ref.count;
      if (!equal && r->ref.index < reach->ref.index + reach->ref.count)
        throw Error(
            ErrId::import_E010,
            fmt::format(
                "{}: names {} inside a pipeline, and {} names {} inside a "
                "pipeline of the same "
                "unit_size and num_chunks; the ranges overlap without being "
                "equal, so MSCCL++ "
                "touches their common bytes at different iterations, which "
                "mKernel does not model",
                r->path,
                to_string(VRef{r->ref.rank, r->ref.buf, r->ref.index / refine_,
                               std::max(1, r->ref.count / refine_)}),
                reach->path,
                to_string(VRef{reach->ref.rank, reach->ref.buf,
                               reach->ref.index / refine_,
                               std::max(1, reach->ref.count / refine_)})),
            loc(r->path),
            "make the ranges of pipelined ops identical or disjoint");
      if (r->ref.index + r->ref.count > reach->ref.index + reach->ref.count)
        reach = r;
    } else {
      reach = r;
    }
  }
}

Reader::Chunk Reader::chunk(const GpuRec& g, const TbRec& t, const json& c, Ch ch, const std::string& path) const {
  if (!c.is_object()) fail(ErrId::import_E002, path, "expected a chunk object {type|buffer_id, index, size}");
  Chunk out;
  int64_t index = get_int(c, {"index"}, path, true, 0, 0, kMaxBufferChunks);
  int64_t size = get_int(c, {"size"}, path, false, 1, 0, kMaxBufferChunks);
  if (c.contains("buffer_id")) {
    if (ch != Ch::memory && ch != Ch::port)
      fail(ErrId::import_E002, path,
           fmt::format("a remote chunk (buffer_id) needs the op's channel_type memory or port, not {}", ch_name(ch)));
    int64_t b = get_int(c, {"buffer_id"}, path, true, 0, 0, INT32_MAX);
    const auto& list = t.rb[ch == Ch::memory ? 0 : 1];
    if (b >= int64_t(list.size()))
      fail(ErrId::import_E004, path + ".buffer_id",
           fmt::format("buffer_id {} but thread block {} of gpu {} lists {} {} remote buffer(s) in remote_buffer_refs",
                       b, t.id, g.id, list.size(), ch_name(ch)));
    const auto& rbuf = g.remote[size_t(list[size_t(b)])];
    out.ref = VRef{rbuf.rank, rbuf.buf, int32_t(index), int32_t(size)};
    out.remote = true;
  } else if (c.contains("type")) {
    out.ref = VRef{g.id, buf_of(c.at("type"), path + ".type"), int32_t(index), int32_t(size)};
  } else {
    fail(ErrId::import_E002, path, "a chunk needs \"type\" (local) or \"buffer_id\" (remote)");
  }
  out.ref.index = int32_t(int64_t(out.ref.index) * refine_);
  out.ref.count = int32_t(int64_t(out.ref.count) * refine_);
  return out;
}

VRef Reader::slice(VRef r, int64_t tb_id, int64_t tbg) const {
  const int64_t len = r.count;
  r.index = int32_t(r.index + tb_id * len / tbg);
  r.count = int32_t(len / tbg);
  return r;
}

void Reader::parse_top() {
  if (!doc_.is_object()) fail(ErrId::import_E002, "$", "an execution plan is a JSON object");
  static const std::set<std::string> known = {"name",          "collective",       "colletive",        "protocol",
                                              "inplace",       "gpus",             "num_threads_per_block",
                                              "use_double_scratch_buffer",          "buffer_alignment",
                                              "min_message_size", "max_message_size", "reuse_resources", "root"};
  for (auto it = doc_.begin(); it != doc_.end(); ++it)
    if (!known.count(it.key())) ignored_.insert("$." + it.key().substr(0, 40));
  if (doc_.contains("name")) name_ = get_str(doc_, "name", "$");
  const char* ckey = doc_.contains("collective") ? "collective" : doc_.contains("colletive") ? "colletive" : "collective";
  std::string c = get_str(doc_, ckey, "$");
  auto coll = parse_collective(c);
  if (!coll)
    fail(ErrId::import_E010, std::string("$.") + ckey, fmt::format("\"{}\" is not a collective mKernel compiles", c.substr(0, 40)),
         "mKernel imports allreduce, allgather, reducescatter, alltoall, broadcast and reduce plans");
  coll_ = *coll;
  if (doc_.contains("protocol")) {
    proto_ = get_str(doc_, "protocol", "$");
    if (proto_ != "Simple" && proto_ != "LL")
      fail(ErrId::import_E002, "$.protocol", fmt::format("protocol must be \"Simple\" or \"LL\", got \"{}\"", proto_.substr(0, 40)));
  }
  {
    const json* ip = opt_field(doc_, {"inplace"});
    if (!ip) fail(ErrId::import_E002, "$", "missing \"inplace\"");
    if (ip->is_boolean()) inplace_ = ip->get<bool>();
    else inplace_ = as_int(*ip, "$.inplace", 0, 1) == 1;
  }
  min_bytes_ = get_int(doc_, {"min_message_size"}, "$", false, 0, 0, INT64_MAX);
  if (doc_.contains("max_message_size")) {
    const json& m = doc_.at("max_message_size");
    if (m.is_number_unsigned() && m.get<uint64_t>() > uint64_t(INT64_MAX)) max_bytes_ = -1;
    else max_bytes_ = as_int(m, "$.max_message_size", 0, INT64_MAX);
  }
  const json& gpus = get_array(doc_, "gpus", "$");
  if (gpus.empty() || gpus.size() > size_t(kMaxRanks))
    fail(ErrId::import_E002, "$.gpus", fmt::format("{} gpus; a plan has 1..{}", gpus.size(), kMaxRanks));
  ngpus_ = int32_t(gpus.size());
  root_ = int32_t(get_int(doc_, {"root"}, "$", false, 0, 0, ngpus_ - 1));
  if (root_ != 0 && !collective_rooted(coll_))
    fail(ErrId::import_E002, "$.root", "root applies to broadcast and reduce only");
  if (proto_ != "Simple")
    notes_.push_back("protocol " + proto_ + " ignored: mKernel chooses its own protocol per size bucket");
}

void Reader::parse_gpu(GpuRec& g) {
  const json& j = *g.j;
  const std::string& p = g.path;
  if (!j.is_object()) fail(ErrId::import_E002, p, "a gpu is an object");
  g.in = get_int(j, {"input_chunks", "inputChunks"}, p, true, 0, 0, kMaxBufferChunks);
  g.out = get_int(j, {"output_chunks", "outputChunks"}, p, true, 0, 0, kMaxBufferChunks);
  g.sc = get_int(j, {"scratch_chunks", "scratchChunks"}, p, true, 0, 0, kMaxBufferChunks);
  static const std::set<std::string> known = {"id", "input_chunks", "output_chunks", "scratch_chunks", "inputChunks",
                                              "outputChunks", "scratchChunks", "channels", "remote_buffers",
                                              "semaphores", "threadblocks", "chunkGroups"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) ignored_.insert(p.substr(0, 2) + "gpus[*]." + it.key().substr(0, 40));
  if (const json* chs = opt_array(j, {"channels"}, p)) {
    for (size_t i = 0; i < chs->size(); ++i) {
      std::string cp = JsonLines::index(p + ".channels", i);
      const json& c = (*chs)[i];
      if (!c.is_object()) fail(ErrId::import_E002, cp, "a channel is an object");
      const json* t = opt_field(c, {"channel_type", "type"});
      if (!t) fail(ErrId::import_E002, cp, "missing \"channel_type\"");
      Ch ch = ch_of(*t, cp + ".channel_type");
      if (c.contains("srcbuff") || c.contains("dstbuff"))
        fail(ErrId::import_E010, cp,
             "this is an MSCCL++ plan from before v0.6 (channels keyed by srcbuff/dstbuff); it is not supported",
             "regenerate the plan with a current mscclpp.language (python -m mscclpp.language ...)");
      if (ch == Ch::sw) {
        SwitchInfo base;
        // "buffer_type" in plans up to MSCCL++ v0.7, "buff" in the ones it
        // writes today
        const json *bt = opt_field(c, {"buffer_type", "buff"});
        if (!bt)
          fail(ErrId::import_E002, cp,
               "missing \"buffer_type\" (or \"buff\"): which buffer the switch "
               "channel maps");
        base.buf = buf_of(
            *bt, cp + (c.contains("buffer_type") ? ".buffer_type" : ".buff"));
        const json& groups = get_array(c, "rank_groups", cp);
        for (size_t k = 0; k < groups.size(); ++k) {
          std::string gp = JsonLines::index(cp + ".rank_groups", k);
          SwitchInfo info = base;
          const json& rs = get_array(groups[k], "ranks", gp);
          for (size_t q = 0; q < rs.size(); ++q)
            info.ranks.push_back(int32_t(as_int(rs[q], JsonLines::index(gp + ".ranks", q), 0, ngpus_ - 1)));
          if (std::find(info.ranks.begin(), info.ranks.end(), g.id) == info.ranks.end())
            fail(ErrId::import_E004, gp, fmt::format("gpu {} is not in its own switch rank group", g.id));
          g.sw.push_back(std::move(info));
        }
        continue;
      }
      if (ch == Ch::none) continue;
      const json* peers = opt_array(c, {"connected_to", "connectedTo"}, cp);
      if (!peers) fail(ErrId::import_E002, cp, "missing \"connected_to\"");
      for (size_t k = 0; k < peers->size(); ++k) {
        std::string pp = JsonLines::index(cp + ".connected_to", k);
        int32_t peer = int32_t(as_int((*peers)[k], pp, INT32_MIN, INT32_MAX));
        if (peer < 0 || peer >= ngpus_ || peer == g.id)
          fail(ErrId::import_E004, pp,
               fmt::format("channel peer {} is {}", peer,
                           peer == g.id ? "the gpu itself" : fmt::format("not a gpu (the plan has {})", ngpus_)));
        (ch == Ch::memory ? g.mem_peer : g.port_peer).push_back(peer);
      }
    }
  }
  if (const json* rbs = opt_array(j, {"remote_buffers"}, p)) {
    for (size_t i = 0; i < rbs->size(); ++i) {
      std::string rp = JsonLines::index(p + ".remote_buffers", i);
      const json& rb = (*rbs)[i];
      int32_t rank = int32_t(get_int(rb, {"rank"}, rp, true, 0, INT32_MIN, INT32_MAX));
      if (rank < 0 || rank >= ngpus_)
        fail(ErrId::import_E004, rp + ".rank", fmt::format("remote buffer of rank {}, but the plan has {} gpus", rank, ngpus_));
      g.remote.push_back({rank, buf_of(field(rb, "type", rp), rp + ".type")});
    }
  }
  if (const json* sems = opt_array(j, {"semaphores"}, p))
    for (size_t i = 0; i < sems->size(); ++i) {
      std::string sp = JsonLines::index(p + ".semaphores", i);
      g.sem_init.push_back(get_int((*sems)[i], {"init_value"}, sp, false, 0, 0, 1 << 20));
    }
}

void Reader::parse_tb(GpuRec& g, TbRec& t) {
  const json& j = *t.j;
  const std::string& p = t.path;
  if (const json* chs = opt_array(j, {"channels"}, p))
    for (size_t i = 0; i < chs->size(); ++i) {
      std::string cp = JsonLines::index(p + ".channels", i);
      const json& c = (*chs)[i];
      if (!c.is_object()) fail(ErrId::import_E002, cp, "a channel reference is an object");
      if (c.contains("cids") || c.contains("ctype"))
        fail(ErrId::import_E010, cp,
             "this is an MSCCL++ plan from before v0.6 (thread-block channels with cids/ctype); it is not supported",
             "regenerate the plan with a current mscclpp.language");
      const json* tj = opt_field(c, {"channel_type", "type"});
      if (!tj) fail(ErrId::import_E002, cp, "missing \"channel_type\"");
      Ch ch = ch_of(*tj, cp + ".channel_type");
      if (ch == Ch::none) continue;
      const json& ids = get_array(c, "channel_ids", cp);
      size_t limit = ch == Ch::memory ? g.mem_peer.size() : ch == Ch::port ? g.port_peer.size() : g.sw.size();
      for (size_t k = 0; k < ids.size(); ++k) {
        std::string ip = JsonLines::index(cp + ".channel_ids", k);
        int64_t id = as_int(ids[k], ip, INT32_MIN, INT32_MAX);
        if (id < 0 || id >= int64_t(limit))
          fail(ErrId::import_E004, ip,
               fmt::format("{} channel {} but gpu {} has {} {} channel(s)", ch_name(ch), id, g.id, limit, ch_name(ch)));
        t.ch[int(ch)].push_back(int32_t(id));
      }
    }
  if (const json* refs = opt_array(j, {"remote_buffer_refs"}, p))
    for (size_t i = 0; i < refs->size(); ++i) {
      std::string rp = JsonLines::index(p + ".remote_buffer_refs", i);
      const json& r = (*refs)[i];
      if (!r.is_object()) fail(ErrId::import_E002, rp, "a remote buffer reference is an object");
      Ch ch = ch_of(field(r, "access_channel_type", rp), rp + ".access_channel_type");
      if (ch != Ch::memory && ch != Ch::port)
        fail(ErrId::import_E002, rp + ".access_channel_type", "remote buffers are reached through memory or port channels");
      const json& ids = get_array(r, "remote_buffer_ids", rp);
      for (size_t k = 0; k < ids.size(); ++k) {
        std::string ip = JsonLines::index(rp + ".remote_buffer_ids", k);
        int64_t id = as_int(ids[k], ip, INT32_MIN, INT32_MAX);
        if (id < 0 || id >= int64_t(g.remote.size()))
          fail(ErrId::import_E004, ip, fmt::format("remote buffer {} but gpu {} has {} remote_buffers", id, g.id, g.remote.size()));
        t.rb[ch == Ch::memory ? 0 : 1].push_back(int32_t(id));
      }
    }
}

void Reader::parse_ops(GpuRec& g, TbRec& t, const json& ops, const std::string& path, int pipeline_ctx) {
  for (size_t i = 0; i < ops.size(); ++i) {
    std::string op_path = JsonLines::index(path, i);
    if (pipeline_ctx < 0) t.node_of_op.push_back(int32_t(g_.nodes.size()));
    add_op(g, t, ops[i], op_path, pipeline_ctx);
  }
}

void Reader::add_op(GpuRec& g, TbRec& t, const json& op, const std::string& path, int pipeline_ctx) {
  if (!op.is_object()) fail(ErrId::import_E002, path, "an op is an object");
  if (++nops_ > kMaxSteps) fail(ErrId::import_E012, path, fmt::format("more than {} ops", kMaxSteps));
  for (const char* old : {"i_buff", "o_buff", "i_cids", "o_cids", "srcs", "dsts", "srcbuff", "dstbuff"})
    if (op.contains(old))
      fail(ErrId::import_E010, path,
           fmt::format("this op uses \"{}\", a field of MSCCL++ plans from before v0.6, which mKernel does not read", old),
           "regenerate the plan with a current mscclpp.language");
  const std::string name = get_str(op, "name", path);
  const SrcLoc l = loc(path);
  int64_t tbg = 1, tbg_id = 0; // set from tbg_info below
  auto node = [&](const std::string& suffix = "") {
    std::string rel = path.size() > t.path.size() + 1 ? path.substr(t.path.size() + 1) : path;
    std::string member =
        tbg > 1 ? fmt::format(", member {} of a thread-block group of {}",
                              tbg_id, tbg)
                : "";
    int32_t n = g_.add_node(t.thread, g.id, l,
                            fmt::format("gpu {} tb {} {} ({}{}{})", g.id, t.id,
                                        rel, name, suffix, member));
    g_.nodes[size_t(n)].payload = -1;
    if (pipeline_ctx >= 0)
      ctx_of_[n] = pipeline_ctx;
    return n;
  };
  // channels named by the op: tb-local indices into the tb's channels of its type
  Ch ch = Ch::none;
  if (op.contains("channel_type")) ch = ch_of(op.at("channel_type"), path + ".channel_type");
  auto channels = [&]() {
    std::vector<int32_t> out;  // gpu-level channel indices
    const json* ids = opt_array(op, {"channel_ids"}, path);
    if (!ids) return out;
    if (ch != Ch::memory && ch != Ch::port && ch != Ch::sw)
      fail(ErrId::import_E002, path, "channel_ids needs a channel_type of memory, port or switch");
    const auto& list = t.ch[int(ch)];
    for (size_t k = 0; k < ids->size(); ++k) {
      std::string ip = JsonLines::index(path + ".channel_ids", k);
      int64_t id = as_int((*ids)[k], ip, INT32_MIN, INT32_MAX);
      if (id < 0 || id >= int64_t(list.size()))
        fail(ErrId::import_E004, ip,
             fmt::format("channel {} but thread block {} of gpu {} has {} {} channel(s)", id, t.id, g.id, list.size(), ch_name(ch)));
      out.push_back(list[size_t(id)]);
    }
    return out;
  };
  auto peer_of = [&](int32_t gch) { return ch == Ch::memory ? g.mem_peer[size_t(gch)] : g.port_peer[size_t(gch)]; };
  auto ordinal = [&](const GpuRec& gg, Ch c, int32_t gch) {  // which channel of type c to the same peer
    const auto& peers = c == Ch::memory ? gg.mem_peer : gg.port_peer;
    int32_t o = 0;
    for (int32_t k = 0; k < gch; ++k) o += peers[size_t(k)] == peers[size_t(gch)];
    return o;
  };
  auto sync_signal = [&](int32_t n, bool is_signal) {
    for (int32_t gch : channels()) {
      if (ch == Ch::sw) fail(ErrId::import_E010, path, "signal/wait on a switch channel is not supported");
      int32_t peer = peer_of(gch);
      SigKey k = is_signal ? SigKey{g.id, peer, ch, ordinal(g, ch, gch)} : SigKey{peer, g.id, ch, ordinal(g, ch, gch)};
      (is_signal ? signals_ : waits_)[k].push_back({n, pipeline_ctx});
    }
  };
  // tbg_info: this thread block's slice of the op's range
  if (op.contains("tbg_info")) {
    const json& ti = op.at("tbg_info");
    std::string tp = path + ".tbg_info";
    tbg = get_int(ti, {"tbg_size"}, tp, true, 1, 1, 64);
    tbg_id = get_int(ti, {"tb_id"}, tp, true, 0, 0, tbg - 1);
  }
  // A range of an op inside a pipeline (`r` before the thread-block group's
  // slice, `mine` after it); see Pipeline.
  auto pipelined = [&](const VRef &r, const VRef &mine, const std::string &cp) {
    if (pipeline_ctx < 0)
      return;
    const Pipeline &pl = pipelines_[size_t(pipeline_ctx)];
    const int64_t size = r.count / refine_;
    if (size != pl.num * tbg)
      fail(ErrId::import_E010, cp,
           fmt::format(
               "a range of {} chunk(s){} inside a pipeline with num_chunks {}: "
               "MSCCL++ runs ceil(num_chunks x "
               "chunk / unit_size) iterations over unit_size bytes of every "
               "{}range, so this one would be {}",
               size,
               tbg > 1
                   ? fmt::format(" split over a thread-block group of {}", tbg)
                   : "",
               pl.num, tbg > 1 ? "member's " : "",
               size < pl.num * tbg ? "overrun past its end"
                                   : "covered only in part"),
           "inside a pipeline, every range is num_chunks chunks long "
           "(num_chunks x tbg_size with a thread-block group)");
    pipe_ranges_.push_back({pl.unit, pl.num, mine, cp});
  };
  auto chunks = [&](const char* key, bool required) {
    std::vector<Chunk> out;
    const json* arr = opt_array(op, {key}, path);
    if (!arr) {
      if (required) fail(ErrId::import_E002, path, fmt::format("missing \"{}\"", key));
      return out;
    }
    for (size_t k = 0; k < arr->size(); ++k) {
      std::string cp = JsonLines::index(path + "." + key, k);
      const json& c = (*arr)[k];
      if (c.is_object() && c.contains("switch_channel_id")) {
        Chunk x;
        x.ref.count = -1;  // marks a switch chunk; resolved by glres
        out.push_back(x);
        continue;
      }
      Chunk x = chunk(g, t, c, ch, cp);
      const VRef whole = x.ref;
      if (tbg > 1) x.ref = slice(x.ref, tbg_id, tbg);
      pipelined(whole, x.ref, cp);
      out.push_back(x);
    }
    return out;
  };
  auto check_bounds = [&](const VRef& r, const std::string& p) {
    int64_t bound = r.buf == VBuf::i   ? geo_.in_chunks()
                    : r.buf == VBuf::o ? geo_.out_chunks()
                                       : geo_.scratch[size_t(r.rank)];
    if (r.index < 0 || int64_t(r.index) + r.count > bound)
      fail(ErrId::import_E005, p,
           fmt::format("{} is outside gpu {}'s {} buffer of {} chunk(s)", to_string(VRef{r.rank, r.buf, r.index / refine_, std::max(1, r.count / refine_)}),
                       r.rank, vbuf_name(r.buf), bound / refine_),
           "chunk indices run from 0 to input_chunks / output_chunks / scratch_chunks - 1");
  };
  auto scratch_use = [&](const VRef& r, bool packet, const std::string& p) {
    if (r.buf != VBuf::s) {
      if (packet)
        fail(ErrId::import_E010, p, fmt::format("packets in the {} buffer: mKernel reads packet ops on scratch only",
                                                vbuf_name(r.buf)));
      return;
    }
    int8_t& k = scratch_kind_[size_t(r.rank)];
    int8_t want = packet ? 2 : 1;
    if (k == 0) {
      k = want;
      first_kind_[size_t(r.rank)] = {path, l.line};
    } else if (k != want) {
      fail(ErrId::import_E010, p,
           fmt::format("gpu {}'s scratch is used both for packets and for plain data (first at {}, line {}); their "
                       "byte layouts overlap, which mKernel does not model",
                       r.rank, first_kind_[size_t(r.rank)].first, first_kind_[size_t(r.rank)].second));
    }
  };
  auto access = [&](int32_t n, const VRef& r, bool write) { g_.access(n, r, write); };
  auto pkt_write = [&](int32_t n, const VRef& r, const std::string& p) {
    for (int32_t k = 0; k < r.count; ++k) {
      auto key = std::make_pair(r.rank, int64_t(r.index) + k);
      auto [it, fresh] = pkt_writer_.emplace(key, n);
      if (!fresh)
        fail(ErrId::import_E008, p,
             fmt::format("packets written twice into gpu {} s[{}] (by {} and {}): a reader could not tell which "
                         "write it waits for",
                         r.rank, (r.index + k) / refine_, g_.where(it->second), g_.where(n)),
             "use a fresh scratch slot for each packet transfer of a plan");
    }
  };
  auto pkt_read = [&](int32_t n, const VRef& r) {
    for (int32_t k = 0; k < r.count; ++k) pkt_readers_[{r.rank, int64_t(r.index) + k}].push_back(n);
  };
  for (auto it = op.begin(); it != op.end(); ++it) {
    static const std::set<std::string> known = {"name", "src_buff", "dst_buff", "channel_ids", "channel_type",
                                                "tbg_info", "barrier_id", "num_threadblocks", "semaphore_ids",
                                                "iter_context", "ops", "reduce_op", "deps"};
    if (!known.count(it.key())) ignored_.insert("op field \"" + it.key().substr(0, 40) + "\"");
  }
  if (op.contains("reduce_op")) {
    const json& ro = op.at("reduce_op");
    if (!ro.is_string() || (ro.get<std::string>() != "sum" && ro.get<std::string>() != "nop"))
      notes_.push_back(fmt::format("{}: reduce_op {} ignored: the reduction op is chosen when the plan is compiled", path,
                                   ro.dump().substr(0, 40)));
  }
  auto old_deps = [&](int32_t n) {
    const json* deps = opt_array(op, {"deps"}, path);
    if (!deps) return;
    for (size_t k = 0; k < deps->size(); ++k) {
      std::string dp = JsonLines::index(path + ".deps", k);
      old_deps_.push_back({g.id, n, get_int((*deps)[k], {"tb"}, dp, true, 0, 0, INT32_MAX),
                           get_int((*deps)[k], {"step"}, dp, true, 0, 0, INT32_MAX), dp});
    }
  };

  // ---- ordering-only ops
  if (name == "nop" || name == "flush") {
    int32_t n = node();
    old_deps(n);
    if (name == "flush") channels();  // validates the ids
    return;
  }
  if (name == "signal" || name == "rlxsignal" || name == "wait" || name == "rlxwait") {
    int32_t n = node();
    old_deps(n);
    if (ch != Ch::memory && ch != Ch::port)
      fail(ErrId::import_E002, path, fmt::format("{} needs channel_type memory or port", name));
    if (!op.contains("channel_ids")) fail(ErrId::import_E002, path, "missing \"channel_ids\"");
    sync_signal(n, name == "signal" || name == "rlxsignal");
    return;
  }
  if (name == "barrier") {
    int64_t id = get_int(op, {"barrier_id"}, path, true, 0, 0, INT32_MAX);
    int64_t nb = get_int(op, {"num_threadblocks"}, path, true, 0, 1, 1 << 16);
    int32_t arrive = node(" arrive");
    old_deps(arrive);
    int32_t depart = node(" depart");
    barriers_[{g.id, id}].push_back({arrive, nb});
    (void)depart;
    return;
  }
  if (name == "sem_acquire" || name == "sem_release") {
    int32_t n = node();
    old_deps(n);
    const json& ids = get_array(op, "semaphore_ids", path);
    for (size_t k = 0; k < ids.size(); ++k) {
      std::string ip = JsonLines::index(path + ".semaphore_ids", k);
      int64_t sid = as_int(ids[k], ip, INT32_MIN, INT32_MAX);
      if (sid < 0 || sid >= int64_t(g.sem_init.size()))
        fail(ErrId::import_E004, ip, fmt::format("semaphore {} but gpu {} declares {} semaphore(s)", sid, g.id, g.sem_init.size()));
      (name == "sem_release" ? releases_ : acquires_)[{g.id, sid}].push_back(n);
    }
    return;
  }
  if (name == "pipeline") {
    if (pipeline_ctx >= 0) fail(ErrId::import_E010, path, "a pipeline inside a pipeline is not supported");
    const json& ic = field(op, "iter_context", path);
    int64_t unit = get_int(ic, {"unit_size"}, path + ".iter_context", true, 0, 1, INT64_MAX);
    int64_t nch = get_int(ic, {"num_chunks"}, path + ".iter_context", true, 0, 0, kMaxBufferChunks);
    if (nch == 0)
      fail(ErrId::import_E002, path + ".iter_context.num_chunks",
           "a pipeline over 0 chunks runs nothing");
    int ctx = int(pipelines_.size());
    pipelines_.push_back({path, unit, nch});
    const json& inner = get_array(op, "ops", path);
    int32_t n = node(" begin");
    old_deps(n);
    parse_ops(g, t, inner, path + ".ops", ctx);
    return;
  }

  // ---- data ops
  static const std::set<std::string> packet_ops = {
      "ppkt", "rppkt", "cpkt", "upkt", "repkt", "recpkt", "respkt", "recspkt"};
  if (pipeline_ctx >= 0 && packet_ops.count(name))
    fail(ErrId::import_E010, path,
         fmt::format("{} inside a pipeline: MSCCL++'s executor runs packet ops "
                     "over their whole range in every "
                     "iteration (they take no iteration offset), repeating the "
                     "transfer; mKernel does not import that",
                     name),
         "move packet ops out of the pipeline");
  OpRec rec;
  int32_t n = -1;
  auto finish = [&]() {
    n = node();
    old_deps(n);
    g_.nodes[size_t(n)].payload = int32_t(ops_.size());
    ops_.push_back(std::move(rec));
  };
  auto pairs = [&](bool dst_remote_ok, bool src_remote_ok, const char* what) {
    auto src = chunks("src_buff", true);
    auto dst = chunks("dst_buff", true);
    if (src.size() != dst.size() || src.empty())
      fail(ErrId::import_E002, path,
           fmt::format("{} has {} source and {} destination chunk(s); they pair up one to one", name, src.size(), dst.size()));
    for (size_t k = 0; k < src.size(); ++k) {
      std::string sp = JsonLines::index(path + ".src_buff", k), dp = JsonLines::index(path + ".dst_buff", k);
      if (src[k].ref.count < 0 || dst[k].ref.count < 0) fail(ErrId::import_E002, path, fmt::format("{} takes no switch chunks", name));
      if (src[k].remote && !src_remote_ok) fail(ErrId::import_E002, sp, fmt::format("{} reads a local chunk ({{type, index, size}})", name));
      if (!src[k].remote && src_remote_ok && !dst_remote_ok)
        fail(ErrId::import_E002, sp, fmt::format("{} reads a remote chunk ({{buffer_id, index, size}})", name));
      if (dst[k].remote && !dst_remote_ok) fail(ErrId::import_E002, dp, fmt::format("{} writes a local chunk", name));
      if (!dst[k].remote && dst_remote_ok && !src_remote_ok)
        fail(ErrId::import_E002, dp, fmt::format("{} writes a remote chunk ({{buffer_id, index, size}})", name));
      if (src[k].ref.count != dst[k].ref.count)
        fail(ErrId::import_E002, path, fmt::format("{} pair {}: source of size {} and destination of size {}", what, k,
                                                   src[k].ref.count / refine_, dst[k].ref.count / refine_));
      check_bounds(src[k].ref, sp);
      check_bounds(dst[k].ref, dp);
      remote_ops_ += src[k].remote || dst[k].remote;
      rec.actions.push_back(Action{ir::OpKind::copy, {dst[k].ref}, {src[k].ref}});
    }
    return std::make_pair(src, dst);
  };
  if (name == "put" || name == "pws" || name == "pwsf" || name == "get" || name == "copy" || name == "ppkt" ||
      name == "rppkt" || name == "cpkt" || name == "upkt") {
    const bool put = name == "put" || name == "pws" || name == "pwsf" || name == "ppkt" || name == "rppkt";
    const bool get = name == "get";
    if ((put || get) && ch != Ch::memory && ch != Ch::port)
      fail(ErrId::import_E002, path, fmt::format("{} needs channel_type memory or port", name));
    auto [src, dst] = pairs(put, get, name.c_str());
    finish();
    // packet-ness per side
    const bool src_pkt = name == "rppkt" || name == "upkt" || (name == "ppkt" && ch == Ch::port);
    const bool dst_pkt = name == "ppkt" || name == "rppkt" || name == "cpkt";
    for (size_t k = 0; k < src.size(); ++k) {
      std::string sp = JsonLines::index(path + ".src_buff", k), dp = JsonLines::index(path + ".dst_buff", k);
      scratch_use(src[k].ref, src_pkt, sp);
      scratch_use(dst[k].ref, dst_pkt, dp);
      access(n, src[k].ref, false);
      if (src_pkt && !(name == "ppkt")) pkt_read(n, src[k].ref);  // port ppkt copies packets without waiting
    }
    for (size_t k = 0; k < dst.size(); ++k) {
      std::string dp = JsonLines::index(path + ".dst_buff", k);
      access(n, dst[k].ref, true);
      if (dst_pkt) pkt_write(n, dst[k].ref, dp);
    }
    if (name == "pws" || name == "pwsf") {
      if (ch != Ch::port) fail(ErrId::import_E002, path, fmt::format("{} needs channel_type port", name));
      sync_signal(n, true);
    }
    // a port put goes through a channel to the remote buffer's rank
    if (ch == Ch::port && put) {
      auto gchs = channels();
      for (size_t k = 0; k < dst.size() && k < gchs.size(); ++k)
        if (g.port_peer[size_t(gchs[k])] != dst[k].ref.rank)
          fail(ErrId::import_E004, JsonLines::index(path + ".dst_buff", k),
               fmt::format("writes gpu {}'s buffer through a port channel to gpu {}", dst[k].ref.rank,
                           g.port_peer[size_t(gchs[k])]));
    }
    return;
  }
  static const std::set<std::string> reduces = {"re", "res", "rre", "rres", "repkt", "recpkt", "respkt", "recspkt"};
  if (reduces.count(name)) {
    auto src = chunks("src_buff", true);
    auto dst = chunks("dst_buff", true);
    const bool pkt = name.size() > 3 && name.substr(name.size() - 3) == "pkt";
    if (src.size() < (pkt ? 2u : 1u) || dst.empty())
      fail(ErrId::import_E002, path, fmt::format("{} needs {} source(s) and a destination", name, pkt ? 2 : 1));
    if (src.size() < 2 && !pkt)
      notes_.push_back(path + ": a reduce of one source is a copy");
    Action a;
    a.kind = src.size() >= 2 ? ir::OpKind::reduce : ir::OpKind::copy;
    const int32_t count = src[0].ref.count;
    for (size_t k = 0; k < src.size(); ++k) {
      std::string sp = JsonLines::index(path + ".src_buff", k);
      if (src[k].ref.count < 0) fail(ErrId::import_E002, sp, fmt::format("{} takes no switch chunks", name));
      if (src[k].ref.count != count) fail(ErrId::import_E002, sp, "all chunks of a reduce have the same size");
      if (src[k].remote && (name != "rre" && name != "rres"))
        fail(ErrId::import_E002, sp, fmt::format("{} reads local chunks only (rre/rres read remote ones)", name));
      if (k == 0 && src[k].remote) fail(ErrId::import_E002, sp, "the first source of a reduce is local");
      check_bounds(src[k].ref, sp);
      scratch_use(src[k].ref, pkt && k > 0, sp);
      remote_ops_ += src[k].remote;
      a.srcs.push_back(src[k].ref);
    }
    for (size_t k = 0; k < dst.size(); ++k) {
      std::string dp = JsonLines::index(path + ".dst_buff", k);
      if (dst[k].ref.count < 0) fail(ErrId::import_E002, dp, fmt::format("{} takes no switch chunks", name));
      if (dst[k].ref.count != count) fail(ErrId::import_E002, dp, "all chunks of a reduce have the same size");
      const bool send = name == "res" || name == "rres" || name == "respkt" || name == "recspkt";
      const size_t first_remote = name == "recspkt" ? 2 : 1;
      if (k == 0 && dst[k].remote) fail(ErrId::import_E002, dp, "the first destination of a reduce is local");
      if (k >= first_remote && !dst[k].remote && send)
        fail(ErrId::import_E002, dp, fmt::format("{} sends its result to remote chunks from destination {} on", name, first_remote));
      if (k > 0 && dst[k].remote && !send)
        fail(ErrId::import_E002, dp, fmt::format("{} does not send: its destinations are local", name));
      if (k > 0 && name == "recpkt" && k > 1) fail(ErrId::import_E002, dp, "recpkt has a data and a packet destination");
      check_bounds(dst[k].ref, dp);
      scratch_use(dst[k].ref, pkt && k > 0, dp);
      remote_ops_ += dst[k].remote;
      a.dsts.push_back(dst[k].ref);
    }
    rec.actions.push_back(a);
    finish();
    for (size_t k = 0; k < src.size(); ++k) {
      access(n, src[k].ref, false);
      if (pkt && k > 0) pkt_read(n, src[k].ref);
    }
    for (size_t k = 0; k < dst.size(); ++k) {
      access(n, dst[k].ref, true);
      if (pkt && k > 0) pkt_write(n, dst[k].ref, JsonLines::index(path + ".dst_buff", k));
    }
    return;
  }
  if (name == "glres") {
    if (ch != Ch::sw) fail(ErrId::import_E002, path, "glres needs channel_type switch");
    const json& sb = get_array(op, "src_buff", path);
    const json& db = get_array(op, "dst_buff", path);
    if (sb.size() != db.size() || sb.empty())
      fail(ErrId::import_E002, path, "glres pairs its src_buff and dst_buff chunks one to one");
    std::vector<VRef> reads, writes;
    for (size_t k = 0; k < sb.size(); ++k) {
      std::string sp = JsonLines::index(path + ".src_buff", k), dp = JsonLines::index(path + ".dst_buff", k);
      auto sw = [&](const json& c, const std::string& cp, const SwitchInfo** info) {
        int64_t sid = get_int(c, {"switch_channel_id"}, cp, true, 0, INT32_MIN, INT32_MAX);
        const auto& list = t.ch[int(Ch::sw)];
        if (sid < 0 || sid >= int64_t(list.size()))
          fail(ErrId::import_E004, cp + ".switch_channel_id",
               fmt::format("switch channel {} but thread block {} of gpu {} has {}", sid, t.id, g.id, list.size()));
        *info = &g.sw[size_t(list[size_t(sid)])];
        int64_t index = get_int(c, {"index"}, cp, true, 0, 0, kMaxBufferChunks);
        int64_t size = get_int(c, {"size"}, cp, false, 1, 0, kMaxBufferChunks);
        VRef r{g.id, (*info)->buf, int32_t(index * refine_), int32_t(size * refine_)};
        const VRef whole = r;
        if (tbg > 1) r = slice(r, tbg_id, tbg);
        pipelined(whole, r, cp);
        return r;
      };
      const SwitchInfo *si = nullptr, *di = nullptr;
      VRef s = sw(sb[k], sp, &si), d = sw(db[k], dp, &di);
      if (si->ranks != di->ranks) fail(ErrId::import_E002, path, "glres reads and writes different rank groups");
      if (s.count != d.count) fail(ErrId::import_E002, path, "glres source and destination differ in size");
      Action a;
      a.kind = si->ranks.size() >= 2 ? ir::OpKind::reduce : ir::OpKind::copy;
      for (int32_t q : si->ranks) {
        VRef sq = s, dq = d;
        sq.rank = dq.rank = q;
        check_bounds(sq, sp);
        check_bounds(dq, dp);
        if (pipeline_ctx >= 0 && q != g.id) { // the group's other ranks'
                                              // ranges, which glres touches too
          const Pipeline &pl = pipelines_[size_t(pipeline_ctx)];
          pipe_ranges_.push_back({pl.unit, pl.num, sq, sp});
          pipe_ranges_.push_back({pl.unit, pl.num, dq, dp});
        }
        a.srcs.push_back(sq);
        a.dsts.push_back(dq);
        reads.push_back(sq);
        writes.push_back(dq);
      }
      remote_ops_ += 1;
      rec.actions.push_back(std::move(a));
    }
    finish();
    for (const VRef& r : reads) access(n, r, false);
    for (const VRef& w : writes) access(n, w, true);
    return;
  }
  fail(ErrId::import_E003, path + ".name", fmt::format("unknown op \"{}\"", name.substr(0, 40)),
       "MSCCL++ ops mKernel reads: put pws pwsf get copy signal wait rlxsignal rlxwait flush barrier nop re res rre "
       "rres ppkt rppkt cpkt upkt repkt recpkt respkt recspkt glres pipeline sem_acquire sem_release");
}

void Reader::link() {
  // signal -> wait, k-th with k-th per (from, to, channel type, channel ordinal)
  std::set<SigKey> keys;
  for (auto& [k, v] : signals_) keys.insert(k);
  for (auto& [k, v] : waits_) keys.insert(k);
  for (const SigKey& k : keys) {
    const auto& sig = signals_[k];
    const auto& wt = waits_[k];
    auto one_thread = [&](const std::vector<std::pair<int32_t, int>>& v, const char* what) {
      for (auto& [n, ctx] : v)
        if (g_.nodes[size_t(n)].thread != g_.nodes[size_t(v.front().first)].thread)
          throw Error(ErrId::import_E008,
                      fmt::format("{} and {} both {} on {} channel {} of gpu {} -> gpu {}: the order of their {}s is "
                                  "undefined",
                                  g_.where(v.front().first), g_.where(n), what, ch_name(k.ch), k.ordinal, k.from, k.to,
                                  what),
                      g_.nodes[size_t(n)].loc, "use a channel from one thread block only");
    };
    if (!sig.empty()) one_thread(sig, "signal");
    if (!wt.empty()) one_thread(wt, "wait");
    for (size_t i = 0; i < std::max(sig.size(), wt.size()); ++i) {
      if (i >= sig.size() || i >= wt.size()) {
        bool is_wait = i >= sig.size();
        int32_t n = is_wait ? wt[i].first : sig[i].first;
        throw Error(ErrId::import_E008,
                    fmt::format("{} is {} {} {} on the {} channel gpu {} -> gpu {} (ordinal {}), but there {} only {} "
                                "matching {}{}",
                                g_.where(n), "the", i + 1, is_wait ? "wait" : "signal", ch_name(k.ch), k.from, k.to,
                                k.ordinal, (is_wait ? sig.size() : wt.size()) == 1 ? "is" : "are",
                                is_wait ? sig.size() : wt.size(), is_wait ? "signal(s)" : "wait(s)",
                                is_wait ? ": it waits forever" : ""),
                    g_.nodes[size_t(n)].loc, "every signal on a channel needs one wait on the paired channel, in order");
      }
      same_iterations_or_fail(
          sig[i].first, wt[i].first,
          fmt::format(
              "the {} signal/wait pair on the {} channel gpu {} -> gpu {}",
              i + 1, ch_name(k.ch), k.from, k.to));
      g_.edge(sig[i].first, wt[i].first);
      ++sync_edges_;
    }
  }
  // barriers: the k-th call of every participant forms instance k
  for (auto& [key, calls] : barriers_) {
    std::map<int32_t, std::vector<int32_t>> by_thread;
    int64_t nb = calls.front().second;
    for (auto& [n, k] : calls) {
      same_iterations_or_fail(
          calls.front().first, n,
          fmt::format("barrier {} of gpu {}", key.second, key.first));
      if (k != nb)
        throw Error(ErrId::import_E008,
                    fmt::format("barrier {} of gpu {} is called with num_threadblocks {} and {}", key.second, key.first, nb, k),
                    g_.nodes[size_t(n)].loc);
      by_thread[g_.nodes[size_t(n)].thread].push_back(n);
    }
    if (int64_t(by_thread.size()) != nb)
      throw Error(ErrId::import_E008,
                  fmt::format("barrier {} of gpu {} waits for {} thread block(s), but {} call it: it {}", key.second,
                              key.first, nb, by_thread.size(), int64_t(by_thread.size()) < nb ? "never opens" : "is ambiguous"),
                  g_.nodes[size_t(calls.front().first)].loc, "num_threadblocks is the number of thread blocks calling the barrier");
    size_t times = by_thread.begin()->second.size();
    for (auto& [th, v] : by_thread)
      if (v.size() != times)
        throw Error(ErrId::import_E008,
                    fmt::format("barrier {} of gpu {}: thread block {} calls it {} time(s), thread block {} {} time(s)",
                                key.second, key.first, g_.threads[size_t(by_thread.begin()->first)].tb, times,
                                g_.threads[size_t(th)].tb, v.size()),
                    g_.nodes[size_t(v.front())].loc);
    for (size_t i = 0; i < times; ++i) {
      int32_t vnode = g_.add_node(-1, key.first, g_.nodes[size_t(by_thread.begin()->second[i])].loc,
                                  fmt::format("gpu {} barrier {} (instance {})", key.first, key.second, i));
      for (auto& [th, v] : by_thread) {
        int32_t arrive = v[i];
        int32_t depart = g_.threads[size_t(th)].nodes[size_t(g_.nodes[size_t(arrive)].pos + 1)];
        g_.edge(arrive, vnode);
        g_.edge(vnode, depart);
        sync_edges_ += 2;
      }
    }
  }
  // semaphores: one releasing and one acquiring thread block, in order
  std::set<std::pair<int32_t, int64_t>> sems;
  for (auto& [k, v] : releases_) sems.insert(k);
  for (auto& [k, v] : acquires_) sems.insert(k);
  for (const auto& k : sems) {
    const auto& rel = releases_[k];
    const auto& acq = acquires_[k];
    const int64_t init = gpus_[size_t(k.first)].sem_init[size_t(k.second)];
    const int32_t first = (rel.empty() ? acq : rel).front();
    for (const auto *list : {&rel, &acq})
      for (int32_t n : *list)
        same_iterations_or_fail(
            first, n, fmt::format("semaphore {} of gpu {}", k.second, k.first));
    for (const auto* list : {&rel, &acq})
      for (int32_t n : *list)
        if (g_.nodes[size_t(n)].thread != g_.nodes[size_t(list->front())].thread)
          throw Error(ErrId::import_E010,
                      fmt::format("semaphore {} of gpu {} is {} by several thread blocks ({} and {}); mKernel reads "
                                  "semaphores with one releasing and one acquiring thread block",
                                  k.second, k.first, list == &rel ? "released" : "acquired", g_.where(list->front()),
                                  g_.where(n)),
                      g_.nodes[size_t(n)].loc);
    if (int64_t(acq.size()) > int64_t(rel.size()) + init)
      throw Error(ErrId::import_E008,
                  fmt::format("semaphore {} of gpu {} is acquired {} time(s) but starts at {} and is released {} "
                              "time(s): {} waits forever",
                              k.second, k.first, acq.size(), init, rel.size(), g_.where(acq[size_t(rel.size() + init)])),
                  g_.nodes[size_t(acq[size_t(rel.size() + init)])].loc);
    if (rel.size() != acq.size())
      throw Error(ErrId::import_E008,
                  fmt::format("semaphore {} of gpu {} is released {} time(s) and acquired {} time(s); it would not "
                              "return to its initial value for the next call",
                              k.second, k.first, rel.size(), acq.size()),
                  g_.nodes[size_t((rel.empty() ? acq : rel).back())].loc);
    for (size_t j = 0; j < acq.size(); ++j) {
      int64_t r = int64_t(j) - init;
      if (r >= 0) {
        g_.edge(rel[size_t(r)], acq[j]);
        ++sync_edges_;
      }
    }
  }
  // packets: the write of a packet happens before every read that waits for it
  for (auto& [key, readers] : pkt_readers_) {
    auto w = pkt_writer_.find(key);
    if (w == pkt_writer_.end())
      throw Error(ErrId::import_E008,
                  fmt::format("{} waits for packets in gpu {} s[{}] that nothing writes: it waits forever",
                              g_.where(readers.front()), key.first, key.second / refine_),
                  g_.nodes[size_t(readers.front())].loc);
    for (int32_t r : readers)
      if (std::find(g_.nodes[size_t(r)].preds.begin(), g_.nodes[size_t(r)].preds.end(), w->second) ==
          g_.nodes[size_t(r)].preds.end()) {
        g_.edge(w->second, r);
        ++sync_edges_;
      }
  }
  // old-style "deps": [{tb, step}]
  for (const OldDep& d : old_deps_) {
    const TbRec* target = nullptr;
    for (const TbRec& t : tbs_[size_t(d.gpu)])
      if (t.id == d.tb) target = &t;
    if (!target)
      throw Error(ErrId::import_E006, fmt::format("{}: depends on thread block {} of gpu {}, which does not exist", d.path, d.tb, d.gpu),
                  loc(d.path));
    if (d.step >= int64_t(target->node_of_op.size()))
      throw Error(ErrId::import_E006,
                  fmt::format("{}: depends on op {} of gpu {} tb {}, which has {} op(s)", d.path, d.step, d.gpu, d.tb,
                              target->node_of_op.size()),
                  loc(d.path));
    g_.edge(target->node_of_op[size_t(d.step)], d.node);
    ++sync_edges_;
  }
}

ir::Schedule Reader::emit(bool inplace, int32_t* staging) const {
  View v(geo_, inplace);
  auto order = topo_order(g_, "the cycle runs through signal/wait pairs, barriers, semaphores, packets and "
                              "thread-block order; some wait can never be released");
  check_races(g_, order, v,
              "a nop orders the steps of its own thread block only; order the "
              "two with a signal/wait pair, a barrier "
              "or a semaphore (or put them in one thread block)");
  ir::Schedule s;
  s.name = name_;
  s.coll = coll_;
  s.nranks = ngpus_;
  s.root = root_;
  s.chunks = geo_.chunks;
  int32_t base = 0;
  for (int32_t x : geo_.scratch) base = std::max(base, x);
  s.scratch = base;
  Emitter em(g_, order, v, s, base);
  em.materialise_in_place_inputs(SrcLoc{file_, 1, "$"});
  for (size_t t = 0; t < order.size(); ++t) {
    const Node& nd = g_.nodes[size_t(order[t])];
    if (nd.payload < 0) continue;
    em.begin_node(int32_t(t), nd.loc);
    const OpRec& rec = ops_[size_t(nd.payload)];
    // all reads of the op first, then its writes
    std::vector<std::vector<std::vector<ir::Ref>>> srcs;
    for (const Action& a : rec.actions) {
      srcs.emplace_back();
      for (const VRef& r : a.srcs) srcs.back().push_back(em.read(r));
    }
    for (size_t i = 0; i < rec.actions.size(); ++i) {
      const Action& a = rec.actions[i];
      if (a.dsts.front().count == 0) continue;
      std::vector<std::vector<ir::Ref>> dsts;
      for (const VRef& r : a.dsts) dsts.push_back(em.write(r));
      em.emit(a.kind, dsts, srcs[i]);
      for (const VRef& r : a.dsts) em.mark_written(r);
    }
  }
  em.finish();
  *staging = em.staging_ops();
  return s;
}

ir::Schedule Reader::run(ImportInfo* info, const ImportOptions& opt) {
  if (text_.size() > (size_t(256) << 20))
    throw Error(ErrId::import_E012, fmt::format("{}: {} bytes is more than an execution plan may have", file_, text_.size()));
  if (lines_.max_depth() > 32)
    throw Error(ErrId::import_E012,
                fmt::format("JSON nested {} levels deep; an execution plan nests at most a few", lines_.max_depth()),
                SrcLoc{file_, 1, {}});
  try {
    doc_ = json::parse(text_.begin(), text_.end());
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for numbers that do not fit a double
    size_t byte = 0;
    if (const auto* pe = dynamic_cast<const json::parse_error*>(&e)) {
      byte = pe->byte;
    } else {  // "number overflow parsing '1e999'": find the number
      std::string w = e.what();
      auto a = w.find('\''), b = w.rfind('\'');
      if (a != std::string::npos && b > a + 1) byte = std::min(text_.find(w.substr(a + 1, b - a - 1)), text_.size());
    }
    uint32_t line = 1;
    for (size_t i = 0; i < byte && i < text_.size(); ++i) line += text_[i] == '\n';
    std::string what = e.what();
    auto colon = what.find("]: ");  // drop nlohmann's "[json.exception.parse_error.101] parse error at ..."
    if (colon != std::string::npos) what = what.substr(colon + 3);
    throw Error(ErrId::import_E001, "malformed JSON: " + what, SrcLoc{file_, line, {}},
                "an MSCCL++ execution plan is one JSON object (as mscclpp.language writes it)");
  }
  if (!lines_.duplicate_key().empty())
    throw Error(ErrId::import_E001, lines_.duplicate_key() + ": the key appears twice in one object",
                SrcLoc{file_, lines_.duplicate_line(), lines_.duplicate_key()});
  parse_top();
  const json& gpus = doc_.at("gpus");
  gpus_.resize(size_t(ngpus_));
  std::vector<int> seen(size_t(ngpus_), -1);
  for (size_t i = 0; i < gpus.size(); ++i) {
    std::string p = JsonLines::index("$.gpus", i);
    int32_t id = int32_t(get_int(gpus[i], {"id"}, p, true, 0, INT32_MIN, INT32_MAX));
    if (id < 0 || id >= ngpus_)
      fail(ErrId::import_E004, p + ".id", fmt::format("gpu id {} but the plan has {} gpus", id, ngpus_));
    if (seen[size_t(id)] >= 0) fail(ErrId::import_E011, p + ".id", fmt::format("gpu {} appears twice (also $.gpus[{}])", id, seen[size_t(id)]));
    seen[size_t(id)] = int(i);
    gpus_[size_t(id)].j = &gpus[i];
    gpus_[size_t(id)].path = p;
    gpus_[size_t(id)].id = id;
  }
  for (GpuRec& g : gpus_) parse_gpu(g);
  // refinement: lcm of the thread-block group sizes
  {
    int64_t L = 1;
    std::vector<const json*> stack;
    for (const GpuRec& g : gpus_)
      if (const json* tbs = opt_array(*g.j, {"threadblocks"}, g.path))
        for (const json& tb : *tbs)
          if (tb.is_object() && tb.contains("ops") && tb.at("ops").is_array())
            for (const json& op : tb.at("ops")) {
              stack.push_back(&op);
              while (!stack.empty()) {
                const json* o = stack.back();
                stack.pop_back();
                if (!o->is_object()) continue;
                if (o->contains("tbg_info") && o->at("tbg_info").is_object() && o->at("tbg_info").contains("tbg_size") &&
                    o->at("tbg_info").at("tbg_size").is_number_integer()) {
                  int64_t sz = o->at("tbg_info").at("tbg_size").get<int64_t>();
                  if (sz >= 1 && sz <= 64) L = std::lcm(L, sz);
                  if (L > 64)
                    throw Error(ErrId::import_E010, "thread-block group sizes whose lcm exceeds 64 are not supported",
                                SrcLoc{file_, 1, "$"});
                }
                if (o->contains("ops") && o->at("ops").is_array())
                  for (const json& in : o->at("ops")) stack.push_back(&in);
              }
            }
    refine_ = int32_t(L);
    g_.refine = refine_;
  }
  // geometry: chunks per block from the declared counts
  geo_.coll = coll_;
  geo_.nranks = ngpus_;
  geo_.root = root_;
  int64_t K = -1;
  const int64_t bin = ir::buf_blocks(coll_, ngpus_, ir::Buf::input), bout = ir::buf_blocks(coll_, ngpus_, ir::Buf::output);
  for (const GpuRec& g : gpus_) {
    for (auto [count, blocks, key] : {std::tuple{g.in, bin, "input_chunks"}, std::tuple{g.out, bout, "output_chunks"}}) {
      if (count == 0) continue;
      if (count % blocks != 0)
        fail(ErrId::import_E011, g.path,
             fmt::format("{}={} is not a multiple of {}, the blocks of a {} of {} gpus", key, count, blocks, name(coll_), ngpus_));
      if (K >= 0 && K != count / blocks)
        fail(ErrId::import_E011, g.path,
             fmt::format("{}={} means {} chunk(s) per block, but another count says {}", key, count, count / blocks, K));
      K = count / blocks;
    }
  }
  if (K < 1) fail(ErrId::import_E011, "$.gpus", "every gpu declares 0 input and 0 output chunks");
  if (K * refine_ > kMaxChunksPerBlock)
    fail(ErrId::import_E012, "$.gpus", fmt::format("{} chunks per block is more than {}", K * refine_, kMaxChunksPerBlock));
  geo_.chunks = int32_t(K * refine_);
  for (const GpuRec& g : gpus_) {
    geo_.scratch.push_back(int32_t(g.sc * refine_));
    if (int64_t(geo_.in_chunks()) + geo_.out_chunks() + g.sc * refine_ > kMaxViewCells / ngpus_)
      fail(ErrId::import_E012, g.path, "too many chunks for one import");
  }
  scratch_kind_.assign(size_t(ngpus_), 0);
  first_kind_.assign(size_t(ngpus_), {});
  // thread blocks and ops
  tbs_.resize(size_t(ngpus_));
  for (GpuRec& g : gpus_) {
    const json& tbs = get_array(*g.j, "threadblocks", g.path);
    std::set<int64_t> ids;
    for (size_t i = 0; i < tbs.size(); ++i) {
      TbRec t;
      t.j = &tbs[i];
      t.path = JsonLines::index(g.path + ".threadblocks", i);
      t.gpu = g.id;
      t.id = int32_t(get_int(tbs[i], {"id"}, t.path, true, 0, 0, int64_t(tbs.size()) - 1));
      if (!ids.insert(t.id).second) fail(ErrId::import_E011, t.path + ".id", fmt::format("thread block {} appears twice", t.id));
      parse_tb(g, t);
      tbs_[size_t(g.id)].push_back(std::move(t));
    }
  }
  for (GpuRec& g : gpus_)
    for (TbRec& t : tbs_[size_t(g.id)]) {
      t.thread = g_.add_thread(g.id, t.id);
      ++ntbs_;
      parse_ops(g, t, get_array(*t.j, "ops", t.path), t.path + ".ops", -1);
    }
  check_pipeline_ranges();
  link();
  if (name_.empty()) {
    auto slash = file_.find_last_of('/');
    name_ = slash == std::string::npos ? file_ : file_.substr(slash + 1);
  }
  if (!ignored_.empty()) {
    std::string list;
    for (const auto& x : ignored_) list += (list.empty() ? "" : ", ") + x;
    notes_.push_back("fields ignored (they do not change what the plan computes): " + list);
  }
  int32_t staging = 0;
  ir::Schedule s = emit(inplace_, &staging);
  (void)opt;
  rotate_to_root0(s, root_);
  if (info) {
    info->format = "mscclpp-json";
    info->name = name_;
    info->protocol = proto_;
    info->inplace = inplace_;
    info->outofplace = !inplace_;
    info->reading = inplace_ ? "in-place" : "out-of-place";
    info->min_bytes = min_bytes_;
    info->max_bytes = max_bytes_;
    info->threadblocks = ntbs_;
    info->steps = nops_;
    info->transfers = remote_ops_;
    info->sync_edges = sync_edges_;
    info->staging_ops = staging;
    info->refine = refine_;
    info->notes = notes_;
    if (refine_ > 1)
      info->notes.push_back(fmt::format("thread-block groups: each file chunk is {} IR chunks, so every member's "
                                        "slice is exact",
                                        refine_));
    if (root_ != 0) info->notes.push_back(fmt::format("root {}: ranks relabelled so that the root is rank 0", root_));
  }
  return s;
}

}  // namespace

ir::Schedule import_mscclpp_json(std::string_view text, const std::string& file_name, ImportInfo* info,
                                 const ImportOptions& opt) {
  return Reader(text, file_name).run(info, opt);
}

}  // namespace mk::importers
