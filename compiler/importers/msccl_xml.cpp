// MSCCL XML -> mKernel IR.
//
// The MSCCL runtime runs each <tb> as one thread block executing its <step>s
// in order; a step waits for the step (depid = thread block, deps = its s)
// it depends on; sends and receives travel over NCCL connections, one FIFO
// per (sender, receiver, channel), so the k-th send on a connection delivers
// to the k-th receive. Steps only touch their own GPU's memory.
//
// Mapping (algo.hpp does the rest):
//   s     send src                  -> a transfer holding src (lazy, see Emitter)
//   r     recv into dst             -> copy dst := transfer
//   rcs   recv, copy, send on       -> copy dst := transfer; send dst
//   rrs   recv, reduce, send on     -> reduce fifo@next := op(transfer, src); send fifo
//   rrc   recv, reduce, copy        -> reduce dst := op(transfer, src)
//   rrcs  recv, reduce, copy, send  -> reduce dst := op(transfer, src); send dst
//   cpy   local copy                -> copy dst := src
//   re    local reduce              -> reduce dst := op(dst, src)
//   nop   wait for a dependency     -> ordering only
//   <copy i_off o_off/> (TACCL writers): output := input before the gpu's steps.
// A copy executes on the rank that holds its source (push), a reduce on the
// rank holding all sources if there is one, else the destination's.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>

#include "compiler/importers/common.hpp"
#include "compiler/importers/xml.hpp"
#include "compiler/verify/verify.hpp"

namespace mk::importers {

using namespace detail;
using xml::Element;

namespace {

const char* kHint = "see docs/import.md for the MSCCL XML format mKernel reads";

enum class StepType { s, r, rcs, rrs, rrc, rrcs, cpy, re, nop, precopy };

struct StepInfo {
  StepType type;
  const char* name;
  bool recv, send, src, dst;  // uses the recv peer / send peer / local src / local dst
};

constexpr StepInfo kSteps[] = {
    {StepType::s, "s", false, true, true, false},         {StepType::r, "r", true, false, false, true},
    {StepType::rcs, "rcs", true, true, false, true},      {StepType::rrs, "rrs", true, true, true, false},
    {StepType::rrc, "rrc", true, false, true, true},      {StepType::rrcs, "rrcs", true, true, true, true},
    {StepType::cpy, "cpy", false, false, true, true},     {StepType::re, "re", false, false, true, true},
    {StepType::nop, "nop", false, false, false, false},
};

struct Step {
  const StepInfo* info = nullptr;  // nullptr: a <copy> pre-copy
  int32_t gpu = 0, tb = 0, s = 0;
  int32_t send_peer = -1, recv_peer = -1;
  VRef src, dst;
  int32_t count = 0;
  int32_t tin = -1, tout = -1;  // transfer ids
  uint32_t line = 0;
};

class Reader {
 public:
  Reader(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  ir::Schedule run(ImportInfo* info, const ImportOptions& opt);

 private:
  SrcLoc loc(uint32_t line) const { return SrcLoc{file_, line, {}}; }
  [[noreturn]] void fail(ErrId id, uint32_t line, const std::string& what, const std::string& hint = kHint) const {
    throw Error(id, what, loc(line), hint);
  }

  const std::string* str_attr(const Element& e, const char* name, bool required) const {
    const xml::Attr* a = e.attr(name);
    if (!a) {
      if (required) fail(ErrId::import_E002, e.line, fmt::format("<{}> has no attribute {}", e.name, name));
      return nullptr;
    }
    return &a->value;
  }

  int64_t int_attr(const Element& e, const char* name, bool required, int64_t dflt, int64_t lo, int64_t hi) const {
    const xml::Attr* a = e.attr(name);
    if (!a) {
      if (required) fail(ErrId::import_E002, e.line, fmt::format("<{}> has no attribute {}", e.name, name));
      return dflt;
    }
    std::string_view v = a->value;
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    if (!v.empty() && v.front() == '+') v.remove_prefix(1);
    int64_t x = 0;
    auto r = std::from_chars(v.data(), v.data() + v.size(), x);
    if (v.empty() || r.ec != std::errc() || r.ptr != v.data() + v.size())
      fail(ErrId::import_E002, a->line,
           fmt::format("attribute {} of <{}> must be an integer, got '{}'", name, e.name, a->value.substr(0, 40)));
    if (x < lo || x > hi)
      fail(ErrId::import_E002, a->line,
           fmt::format("attribute {} of <{}> is {}, outside {}..{}", name, e.name, x, lo, hi));
    return x;
  }

  VBuf buf_attr(const Element& e, const char* name) const {
    const std::string* v = str_attr(e, name, true);
    std::string l;
    for (char c : *v) l += char(std::tolower(static_cast<unsigned char>(c)));
    if (l == "i" || l == "input") return VBuf::i;
    if (l == "o" || l == "output") return VBuf::o;
    if (l == "s" || l == "scratch") return VBuf::s;
    fail(ErrId::import_E002, e.attr(name)->line,
         fmt::format("attribute {} of <{}> must be i, o or s, got '{}'", name, e.name, v->substr(0, 40)));
  }

  void check_ref(const View& v, const VRef& r, uint32_t line, const char* role, const Step& st) const;
  void parse(const Element& root);
  void build_graph();
  ir::Schedule emit(bool inplace, int32_t* staging) const;

  std::string_view text_;
  const std::string& file_;

  // <algo>
  std::string name_, proto_ = "Simple";
  Collective coll_ = Collective::allreduce;
  int32_t ngpus_ = 0, root_ = 0, nchannels_ = 0;
  int64_t nchunks_ = -1, min_bytes_ = 0, max_bytes_ = -1;
  bool inplace_ = false, outofplace_ = true;
  uint32_t algo_line_ = 0;
  Geometry geo_;
  std::vector<std::string> notes_;

  std::vector<Step> steps_;
  Graph g_;
  int32_t ntransfers_ = 0, ndeps_ = 0, ntbs_ = 0;
};

void Reader::check_ref(const View& v, const VRef& r, uint32_t line, const char* role, const Step& st) const {
  const int32_t bound = v.bound(r.rank, r.buf);
  if (r.index < 0 || int64_t(r.index) + r.count > bound) {
    std::string declared;
    if (r.buf == VBuf::s)
      declared = fmt::format("gpu {} declares s_chunks={}", r.rank, bound);
    else
      declared = fmt::format("the {} buffer of gpu {} has {} chunk(s) here", vbuf_name(r.buf), r.rank, bound);
    fail(ErrId::import_E005, line,
         fmt::format("gpu {} tb {} step {} ({}): {} {}[{}{}] is outside its buffer: {}", st.gpu, st.tb, st.s,
                     st.info ? st.info->name : "copy", role, vbuf_letter(r.buf), r.index,
                     r.count == 1 ? "" : fmt::format(":{}", int64_t(r.index) + r.count), declared),
         "chunk indices run from 0 to the buffer's chunk count - 1 (nchunksperloop, i_chunks, o_chunks, s_chunks)");
  }
}

void Reader::parse(const Element& root) {
  if (root.name != "algo")
    fail(ErrId::import_E002, root.line, fmt::format("the root element is <{}>; an MSCCL algorithm is an <algo>", root.name));
  algo_line_ = root.line;
  static const std::set<std::string> known_algo = {"name",     "proto",    "nchannels", "nchunksperloop",
                                                   "ngpus",    "coll",     "inplace",   "outofplace",
                                                   "minBytes", "maxBytes", "redop",     "root"};
  std::set<std::string> ignored;
  for (const auto& a : root.attrs)
    if (!known_algo.count(a.name)) ignored.insert("<algo " + a.name + ">");
  if (const std::string* n = str_attr(root, "name", false)) name_ = *n;
  if (const std::string* p = str_attr(root, "proto", false)) {
    std::string l;
    for (char c : *p) l += char(std::tolower(static_cast<unsigned char>(c)));
    if (l == "simple") proto_ = "Simple";
    else if (l == "ll") proto_ = "LL";
    else if (l == "ll128") proto_ = "LL128";
    else
      fail(ErrId::import_E002, root.attr("proto")->line,
           fmt::format("proto must be Simple, LL or LL128, got '{}'", p->substr(0, 40)));
  }
  ngpus_ = int32_t(int_attr(root, "ngpus", true, 0, 1, kMaxRanks));
  nchannels_ = int32_t(int_attr(root, "nchannels", false, 0, 0, 1 << 16));
  nchunks_ = int_attr(root, "nchunksperloop", false, -1, 1, kMaxBufferChunks);
  {
    const std::string* c = str_attr(root, "coll", true);
    auto coll = parse_collective(*c);
    if (!coll) {
      std::string l;
      for (char ch : *c) l += char(std::tolower(static_cast<unsigned char>(ch)));
      static const std::set<std::string> others = {"custom", "sendrecv", "send", "recv", "gather",
                                                   "scatter", "alltonext", "alltoallv", "all_to_allv"};
      fail(others.count(l) ? ErrId::import_E010 : ErrId::import_E002, root.attr("coll")->line,
           fmt::format("coll=\"{}\" is not a collective mKernel compiles", c->substr(0, 40)),
           "mKernel imports allreduce, allgather, reducescatter (reduce_scatter), alltoall, broadcast and reduce");
    }
    coll_ = *coll;
  }
  inplace_ = int_attr(root, "inplace", false, 0, 0, 1) == 1;
  outofplace_ = int_attr(root, "outofplace", false, inplace_ ? 0 : 1, 0, 1) == 1;
  if (!inplace_ && !outofplace_)
    fail(ErrId::import_E002, algo_line_, "inplace=\"0\" and outofplace=\"0\": the algorithm declares no use",
         "set inplace=\"1\" for in-place calls, outofplace=\"1\" for out-of-place calls, or both");
  min_bytes_ = int_attr(root, "minBytes", false, 0, 0, INT64_MAX);
  max_bytes_ = int_attr(root, "maxBytes", false, -1, 0, INT64_MAX);
  root_ = int32_t(int_attr(root, "root", false, 0, 0, ngpus_ - 1));
  if (root_ != 0 && !collective_rooted(coll_))
    fail(ErrId::import_E002, root.attr("root")->line, "root applies to broadcast and reduce only");
  if (const std::string* r = str_attr(root, "redop", false))
    notes_.push_back(fmt::format("redop=\"{}\" ignored: the reduction op is chosen when the plan is compiled",
                                 r->substr(0, 40)));
  if (proto_ != "Simple" || nchannels_ > 1)
    notes_.push_back(fmt::format("proto={} nchannels={} ignored: mKernel chooses its own protocol, tiles and thread "
                                 "blocks per size bucket",
                                 proto_, nchannels_));

  // <gpu> elements
  std::vector<const Element*> gpus(static_cast<size_t>(ngpus_), nullptr);
  for (const Element& e : root.children) {
    if (e.name != "gpu")
      fail(ErrId::import_E002, e.line,
           fmt::format("unexpected element <{}> in <algo>: an algorithm holds <gpu> elements", e.name));
    int32_t id = int32_t(int_attr(e, "id", true, 0, 0, INT32_MAX));
    if (id >= ngpus_)
      fail(ErrId::import_E004, e.attr("id")->line, fmt::format("<gpu id=\"{}\"> but ngpus=\"{}\"", id, ngpus_));
    if (gpus[size_t(id)])
      fail(ErrId::import_E011, e.line, fmt::format("gpu {} appears twice (also on line {})", id, gpus[size_t(id)]->line));
    gpus[size_t(id)] = &e;
  }
  for (int32_t r = 0; r < ngpus_; ++r)
    if (!gpus[size_t(r)])
      fail(ErrId::import_E011, algo_line_,
           fmt::format("ngpus=\"{}\" but there is no <gpu id=\"{}\">", ngpus_, r),
           "every rank needs a <gpu> element, even one without thread blocks");

  // Geometry: nchunksperloop is the larger buffer's chunk count.
  geo_.coll = coll_;
  geo_.nranks = ngpus_;
  geo_.root = root_;
  geo_.scratch.assign(size_t(ngpus_), 0);
  geo_.decl_in.assign(size_t(ngpus_), -1);
  geo_.decl_out.assign(size_t(ngpus_), -1);
  int64_t largest = 0;
  for (int32_t r = 0; r < ngpus_; ++r) {
    const Element& e = *gpus[size_t(r)];
    geo_.decl_in[size_t(r)] = int32_t(int_attr(e, "i_chunks", false, -1, 0, kMaxBufferChunks));
    geo_.decl_out[size_t(r)] = int32_t(int_attr(e, "o_chunks", false, -1, 0, kMaxBufferChunks));
    geo_.scratch[size_t(r)] = int32_t(int_attr(e, "s_chunks", false, 0, 0, kMaxBufferChunks));
    largest = std::max<int64_t>({largest, geo_.decl_in[size_t(r)], geo_.decl_out[size_t(r)]});
  }
  const int64_t blocks = std::max(ir::buf_blocks(coll_, ngpus_, ir::Buf::input), ir::buf_blocks(coll_, ngpus_, ir::Buf::output));
  int64_t total = nchunks_ > 0 ? nchunks_ : largest;
  if (total < 1)
    fail(ErrId::import_E011, algo_line_, "no nchunksperloop and no gpu declares i_chunks or o_chunks",
         "nchunksperloop is the chunk count of the larger of the input and output buffers");
  if (total % blocks != 0)
    fail(ErrId::import_E011, algo_line_,
         fmt::format("nchunksperloop={} is not a multiple of {}: a {} of {} gpus has {} blocks in its larger buffer",
                     total, blocks, name(coll_), ngpus_, blocks));
  if (total / blocks > kMaxChunksPerBlock)
    fail(ErrId::import_E012, algo_line_, fmt::format("{} chunks per block is more than {}", total / blocks, kMaxChunksPerBlock));
  geo_.chunks = int32_t(total / blocks);
  {
    int64_t per_rank = int64_t(geo_.in_chunks()) + geo_.out_chunks();
    for (int32_t x : geo_.scratch) per_rank = std::max<int64_t>(per_rank, int64_t(geo_.in_chunks()) + geo_.out_chunks() + x);
    if (per_rank * ngpus_ > kMaxViewCells)
      fail(ErrId::import_E012, algo_line_,
           fmt::format("{} gpus x {} chunks is more than the {} chunks an import may have", ngpus_, per_rank, kMaxViewCells));
  }
  for (int32_t r = 0; r < ngpus_; ++r) {
    const Element& e = *gpus[size_t(r)];
    if (geo_.decl_in[size_t(r)] > geo_.in_chunks())
      fail(ErrId::import_E011, e.attr("i_chunks")->line,
           fmt::format("gpu {} declares i_chunks={}, but a {} of {} gpus with {} chunk(s) per block has {} input "
                       "chunk(s)",
                       r, geo_.decl_in[size_t(r)], name(coll_), ngpus_, geo_.chunks, geo_.in_chunks()),
           "nchunksperloop is the chunk count of the larger of the input and output buffers");
    if (geo_.decl_out[size_t(r)] > geo_.out_chunks())
      fail(ErrId::import_E011, e.attr("o_chunks")->line,
           fmt::format("gpu {} declares o_chunks={}, but a {} of {} gpus with {} chunk(s) per block has {} output "
                       "chunk(s)",
                       r, geo_.decl_out[size_t(r)], name(coll_), ngpus_, geo_.chunks, geo_.out_chunks()),
           "nchunksperloop is the chunk count of the larger of the input and output buffers");
  }

  // Thread blocks and steps.
  static const std::set<std::string> known_step = {"s",     "type",  "srcbuf", "srcoff", "dstbuf", "dstoff",
                                                   "cnt",   "depid", "deps",   "hasdep"};
  static const std::set<std::string> known_tb = {"id", "send", "recv", "chan"};
  struct TbRec {
    const Element* e;
    int32_t id, send, recv, chan, thread;
    std::map<int64_t, int32_t> by_s;  // s -> node
  };
  std::vector<std::vector<TbRec>> tbs(static_cast<size_t>(ngpus_));
  struct PendingDep {
    int32_t gpu, node;
    int64_t depid, deps;
    uint32_t line;
  };
  std::vector<PendingDep> pending;
  std::vector<std::vector<std::pair<int32_t, const Element*>>> copies(static_cast<size_t>(ngpus_));
  View probe(geo_, false);  // bounds of i, o and s (the same in both readings)
  for (int32_t r = 0; r < ngpus_; ++r) {
    const Element& ge = *gpus[size_t(r)];
    for (const auto& a : ge.attrs)
      if (a.name != "id" && a.name != "i_chunks" && a.name != "o_chunks" && a.name != "s_chunks")
        ignored.insert("<gpu " + a.name + ">");
    for (const Element& te : ge.children) {
      if (te.name == "copy") {
        copies[size_t(r)].push_back({r, &te});
        continue;
      }
      if (te.name != "tb")
        fail(ErrId::import_E002, te.line,
             fmt::format("unexpected element <{}> in <gpu>: a gpu holds <tb> (and <copy>) elements", te.name));
      TbRec tb;
      tb.e = &te;
      tb.id = int32_t(int_attr(te, "id", true, 0, 0, 1 << 20));
      tb.send = int32_t(int_attr(te, "send", false, -1, -1, INT32_MAX));
      tb.recv = int32_t(int_attr(te, "recv", false, -1, -1, INT32_MAX));
      tb.chan = int32_t(int_attr(te, "chan", false, 0, 0, 1 << 16));
      for (const auto& a : te.attrs)
        if (!known_tb.count(a.name)) ignored.insert("<tb " + a.name + ">");
      for (const TbRec& o : tbs[size_t(r)])
        if (o.id == tb.id)
          fail(ErrId::import_E011, te.line, fmt::format("gpu {} has two <tb id=\"{}\"> (also on line {})", r, tb.id, o.e->line));
      for (int32_t peer : {tb.send, tb.recv})
        if (peer >= ngpus_ || peer == r)
          fail(ErrId::import_E004, te.line,
               fmt::format("gpu {} tb {}: peer {} is {}", r, tb.id, peer,
                           peer == r ? "the gpu itself" : fmt::format("not a gpu (ngpus={})", ngpus_)),
               "send and recv name another gpu, or -1 for none");
      tbs[size_t(r)].push_back(std::move(tb));
    }
  }
  // Nodes, in file order per thread block.
  for (int32_t r = 0; r < ngpus_; ++r) {
    // pre-copies: before every thread block of this gpu
    std::vector<int32_t> pre;
    if (!copies[size_t(r)].empty()) {
      int32_t th = g_.add_thread(r, -1);
      for (auto& [gpu, ce] : copies[size_t(r)]) {
        Step st;
        st.gpu = r;
        st.tb = -1;
        st.s = int32_t(pre.size());
        st.line = ce->line;
        st.count = int32_t(int_attr(*ce, "cnt", false, 1, 0, kMaxBufferChunks));
        st.src = VRef{r, VBuf::i, int32_t(int_attr(*ce, "i_off", true, 0, 0, kMaxBufferChunks)), st.count};
        st.dst = VRef{r, VBuf::o, int32_t(int_attr(*ce, "o_off", true, 0, 0, kMaxBufferChunks)), st.count};
        if (st.count > 0) {
          check_ref(probe, st.src, ce->line, "source", st);
          check_ref(probe, st.dst, ce->line, "destination", st);
        }
        int32_t n = g_.add_node(th, r, loc(ce->line), fmt::format("gpu {} <copy> on line {}", r, ce->line));
        if (st.count > 0) {
          g_.access(n, st.src, false);
          g_.access(n, st.dst, true);
        }
        g_.nodes[size_t(n)].payload = int32_t(steps_.size());
        steps_.push_back(st);
        pre.push_back(n);
      }
    }
    for (TbRec& tb : tbs[size_t(r)]) {
      tb.thread = g_.add_thread(r, tb.id);
      ++ntbs_;
      int32_t pos = 0;
      for (const Element& se : tb.e->children) {
        if (se.name == "op")
          fail(ErrId::import_E010, se.line,
               "<op> elements (msccl-tools ir_to_xml with old_format=False) are not supported",
               "regenerate the XML with old_format=True (<step> elements with srcbuf/srcoff/dstbuf/dstoff)");
        if (se.name != "step")
          fail(ErrId::import_E002, se.line,
               fmt::format("unexpected element <{}> in <tb>: a thread block holds <step> elements", se.name));
        if (int64_t(steps_.size()) >= kMaxSteps)
          fail(ErrId::import_E012, se.line, fmt::format("more than {} steps", kMaxSteps));
        Step st;
        st.gpu = r;
        st.tb = tb.id;
        st.line = se.line;
        st.s = int32_t(int_attr(se, "s", false, pos, 0, INT32_MAX));
        ++pos;
        const std::string* type = str_attr(se, "type", true);
        std::string ltype;
        for (char c : *type) ltype += char(std::tolower(static_cast<unsigned char>(c)));
        for (const StepInfo& k : kSteps)
          if (ltype == k.name) st.info = &k;
        if (!st.info)
          fail(ErrId::import_E003, se.attr("type")->line,
               fmt::format("gpu {} tb {} step {}: unknown step type '{}'", r, tb.id, st.s, type->substr(0, 40)),
               "MSCCL step types: s r rcs rrs rrc rrcs cpy re nop");
        for (const auto& a : se.attrs)
          if (!known_step.count(a.name)) ignored.insert("<step " + a.name + ">");
        const StepInfo& k = *st.info;
        st.count = k.type == StepType::nop ? 0 : int32_t(int_attr(se, "cnt", false, 1, 0, kMaxBufferChunks));
        if (k.src) st.src = VRef{r, buf_attr(se, "srcbuf"), int32_t(int_attr(se, "srcoff", true, 0, -1, kMaxBufferChunks)), st.count};
        if (k.dst) st.dst = VRef{r, buf_attr(se, "dstbuf"), int32_t(int_attr(se, "dstoff", true, 0, -1, kMaxBufferChunks)), st.count};
        if (st.count > 0) {
          if (k.src) check_ref(probe, st.src, se.line, "source", st);
          if (k.dst) check_ref(probe, st.dst, se.line, "destination", st);
        }
        if (k.send) {
          if (tb.send < 0)
            fail(ErrId::import_E004, se.line,
                 fmt::format("gpu {} tb {} step {} ({}) sends, but the thread block has send=\"-1\"", r, tb.id, st.s, k.name));
          st.send_peer = tb.send;
        }
        if (k.recv) {
          if (tb.recv < 0)
            fail(ErrId::import_E004, se.line,
                 fmt::format("gpu {} tb {} step {} ({}) receives, but the thread block has recv=\"-1\"", r, tb.id,
                             st.s, k.name));
          st.recv_peer = tb.recv;
        }
        if (tb.by_s.count(st.s))
          fail(ErrId::import_E002, se.line, fmt::format("gpu {} tb {} has two steps with s=\"{}\"", r, tb.id, st.s));
        int32_t n = g_.add_node(tb.thread, r, loc(se.line),
                                fmt::format("gpu {} tb {} step {} ({})", r, tb.id, st.s, k.name));
        tb.by_s[st.s] = n;
        if (st.count > 0) {
          if (k.src) g_.access(n, st.src, false);
          if (k.type == StepType::re) g_.access(n, st.dst, false);
          if (k.dst) g_.access(n, st.dst, true);
        }
        g_.nodes[size_t(n)].payload = int32_t(steps_.size());
        steps_.push_back(st);
        {
          int64_t depid = int_attr(se, "depid", false, -1, -1, INT32_MAX);
          int64_t deps = int_attr(se, "deps", false, -1, -1, INT32_MAX);
          if (depid >= 0) {
            if (deps < 0)
              fail(ErrId::import_E006, se.line,
                   fmt::format("gpu {} tb {} step {}: depid=\"{}\" but deps=\"{}\"", r, tb.id, st.s, depid, deps),
                   "deps is the s of the step depended on");
            pending.push_back({r, n, depid, deps, se.line});
          }
        }
        if (pos == 1)
          for (int32_t p : pre) g_.edge(p, n);
      }
    }
  }
  // Dependencies (same gpu): depid = thread block id, deps = its step's s.
  for (const PendingDep& d : pending) {
    const TbRec* target = nullptr;
    for (const TbRec& o : tbs[size_t(d.gpu)])
      if (o.id == d.depid) target = &o;
    if (!target)
      fail(ErrId::import_E006, d.line,
           fmt::format("{} depends on thread block {} of gpu {}, which does not exist", g_.nodes[size_t(d.node)].what,
                       d.depid, d.gpu),
           "depid names a <tb id> of the same gpu and deps the s of one of its steps");
    auto it = target->by_s.find(d.deps);
    if (it == target->by_s.end())
      fail(ErrId::import_E006, d.line,
           fmt::format("{} depends on step {} of gpu {} tb {}, which has no such step", g_.nodes[size_t(d.node)].what,
                       d.deps, d.gpu, d.depid),
           "depid names a <tb id> of the same gpu and deps the s of one of its steps");
    g_.edge(it->second, d.node);
    ++ndeps_;
  }
  // Connections: the k-th send on (sender, receiver, channel) feeds the k-th
  // receive on it.
  std::map<std::tuple<int32_t, int32_t, int32_t>, std::pair<const TbRec*, const TbRec*>> conns;
  for (int32_t r = 0; r < ngpus_; ++r)
    for (const TbRec& tb : tbs[size_t(r)]) {
      if (tb.send >= 0) {
        auto& c = conns[{r, tb.send, tb.chan}];
        if (c.first)
          fail(ErrId::import_E008, tb.e->line,
               fmt::format("gpu {}: thread blocks {} and {} both send to gpu {} on channel {}; the order of their "
                           "sends on that connection is undefined",
                           r, c.first->id, tb.id, tb.send, tb.chan),
               "give each thread block its own channel (chan) per peer");
        c.first = &tb;
      }
      if (tb.recv >= 0) {
        auto& c = conns[{tb.recv, r, tb.chan}];
        if (c.second)
          fail(ErrId::import_E008, tb.e->line,
               fmt::format("gpu {}: thread blocks {} and {} both receive from gpu {} on channel {}; the order of "
                           "their receives on that connection is undefined",
                           r, c.second->id, tb.id, tb.recv, tb.chan),
               "give each thread block its own channel (chan) per peer");
        c.second = &tb;
      }
    }
  for (auto& [key, pair] : conns) {
    auto [from, to, chan] = key;
    std::vector<int32_t> sends, recvs;
    if (pair.first)
      for (int32_t n : g_.threads[size_t(pair.first->thread)].nodes)
        if (steps_[size_t(g_.nodes[size_t(n)].payload)].info->send) sends.push_back(n);
    if (pair.second)
      for (int32_t n : g_.threads[size_t(pair.second->thread)].nodes)
        if (steps_[size_t(g_.nodes[size_t(n)].payload)].info->recv) recvs.push_back(n);
    for (size_t k = 0; k < std::max(sends.size(), recvs.size()); ++k) {
      if (k >= sends.size() || k >= recvs.size()) {
        int32_t n = k < sends.size() ? sends[k] : recvs[k];
        bool is_send = k < sends.size();
        fail(ErrId::import_E008, g_.nodes[size_t(n)].loc.line,
             fmt::format("{} is the {} {} on the connection gpu {} -> gpu {} (channel {}), but gpu {} {} only {} "
                         "time(s) there",
                         g_.nodes[size_t(n)].what, k + 1, is_send ? "send" : "receive", from, to, chan,
                         is_send ? to : from, is_send ? "receives" : "sends", is_send ? recvs.size() : sends.size()),
             "sends and receives pair up in order per (sender, receiver, channel)");
      }
      Step& s = steps_[size_t(g_.nodes[size_t(sends[k])].payload)];
      Step& rcv = steps_[size_t(g_.nodes[size_t(recvs[k])].payload)];
      if (s.count != rcv.count)
        fail(ErrId::import_E008, rcv.line,
             fmt::format("{} receives {} chunk(s), but the matching send {} sends {}", g_.nodes[size_t(recvs[k])].what,
                         rcv.count, g_.where(sends[k]), s.count));
      s.tout = rcv.tin = ntransfers_++;
      g_.edge(sends[k], recvs[k]);
    }
  }
  if (!ignored.empty()) {
    std::string list;
    for (const auto& x : ignored) list += (list.empty() ? "" : ", ") + x;
    notes_.push_back("attributes ignored (they do not change what the algorithm computes): " + list);
  }
}

ir::Schedule Reader::emit(bool inplace, int32_t* staging) const {
  View v(geo_, inplace);
  std::string hint = "add a dependency (depid/deps) between the two steps, or put them in one thread block";
  auto order = topo_order(g_, "the cycle runs through dependencies (depid/deps), thread-block order and "
                              "send/receive pairs; break it or reorder the steps");
  check_races(g_, order, v, hint);

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
  em.materialise_in_place_inputs(loc(algo_line_));
  std::vector<int32_t> flight(size_t(ntransfers_), -1);
  for (size_t t = 0; t < order.size(); ++t) {
    const Node& nd = g_.nodes[size_t(order[t])];
    const Step& st = steps_[size_t(nd.payload)];
    SrcLoc l = nd.loc;
    l.func = nd.what;
    em.begin_node(int32_t(t), l);
    const bool data = st.count > 0;
    if (!st.info) {  // <copy>
      if (data) {
        auto src = em.read(st.src);
        em.emit(ir::OpKind::copy, {em.write(st.dst)}, {src});
        em.mark_written(st.dst);
      }
      continue;
    }
    std::vector<ir::Ref> in;
    if (st.info->recv) in = em.consume(flight[size_t(st.tin)]);
    switch (st.info->type) {
      case StepType::s:
        flight[size_t(st.tout)] = em.capture(st.gpu, st.send_peer, data ? em.read(st.src) : std::vector<ir::Ref>{});
        break;
      case StepType::r:
      case StepType::rcs:
        if (data) {
          em.emit(ir::OpKind::copy, {em.write(st.dst)}, {in});
          em.mark_written(st.dst);
        }
        if (st.info->type == StepType::rcs)
          flight[size_t(st.tout)] = em.capture(st.gpu, st.send_peer, data ? em.read(st.dst) : std::vector<ir::Ref>{});
        break;
      case StepType::rrs: {
        std::vector<ir::Ref> fifo;
        if (data) {
          auto src = em.read(st.src);
          fifo = em.fresh(st.send_peer, st.count);
          em.emit(ir::OpKind::reduce, {fifo}, {in, src});
        }
        flight[size_t(st.tout)] = em.capture(st.gpu, st.send_peer, fifo);
        break;
      }
      case StepType::rrc:
      case StepType::rrcs:
        if (data) {
          auto src = em.read(st.src);
          em.emit(ir::OpKind::reduce, {em.write(st.dst)}, {in, src});
          em.mark_written(st.dst);
        }
        if (st.info->type == StepType::rrcs)
          flight[size_t(st.tout)] = em.capture(st.gpu, st.send_peer, data ? em.read(st.dst) : std::vector<ir::Ref>{});
        break;
      case StepType::cpy:
        if (data) {
          auto src = em.read(st.src);
          em.emit(ir::OpKind::copy, {em.write(st.dst)}, {src});
          em.mark_written(st.dst);
        }
        break;
      case StepType::re:
        if (data) {
          auto src = em.read(st.src);
          auto acc = em.read(st.dst);
          em.emit(ir::OpKind::reduce, {em.write(st.dst)}, {acc, src});
          em.mark_written(st.dst);
        }
        break;
      case StepType::nop:
      case StepType::precopy: break;
    }
  }
  em.finish();
  *staging = em.staging_ops();
  return s;
}

ir::Schedule Reader::run(ImportInfo* info, const ImportOptions& opt) {
  Element root = xml::parse(text_, file_);
  parse(root);
  if (name_.empty()) {
    auto slash = file_.find_last_of('/');
    name_ = slash == std::string::npos ? file_ : file_.substr(slash + 1);
  }
  const bool primary_inplace = !outofplace_;
  int32_t staging = 0;
  ir::Schedule s = emit(primary_inplace, &staging);
  if (inplace_ && outofplace_ && opt.check_both_readings) {
    int32_t other_staging = 0;
    try {
      ir::Schedule other = emit(true, &other_staging);
      verify::verify_semantics(other);
    } catch (const Error& e) {
      rethrow_in_reading(e, "in-place",
                         "the file declares inplace=\"1\" and outofplace=\"1\"; under the out-of-place reading it "
                         "is fine, but in-place (input inside the output)");
    }
  }
  rotate_to_root0(s, root_);
  if (info) {
    info->format = "msccl-xml";
    info->name = name_;
    info->protocol = proto_;
    info->inplace = inplace_;
    info->outofplace = outofplace_;
    info->reading = primary_inplace ? "in-place" : "out-of-place";
    info->min_bytes = min_bytes_;
    info->max_bytes = max_bytes_;
    info->threadblocks = ntbs_;
    info->steps = 0;
    for (const Step& st : steps_) info->steps += st.info != nullptr;
    info->transfers = ntransfers_;
    info->sync_edges = ndeps_;
    info->staging_ops = staging;
    info->refine = 1;
    info->notes = notes_;
    if (root_ != 0)
      info->notes.push_back(fmt::format("root=\"{}\": ranks relabelled so that the root is rank 0 (plans are built "
                                        "for root 0 and relabelled at run time)",
                                        root_));
  }
  return s;
}

}  // namespace

ir::Schedule import_msccl_xml(std::string_view text, const std::string& file_name, ImportInfo* info,
                              const ImportOptions& opt) {
  return Reader(text, file_name).run(info, opt);
}

}  // namespace mk::importers
