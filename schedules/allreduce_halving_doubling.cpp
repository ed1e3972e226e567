// allreduce.halving_doubling: recursive halving reduce-scatter, then recursive
// doubling all-gather (Rabenseifner). With p = n ranks a power of two and p
// chunks: at reduce-scatter step k (h = p / 2^(k+1)) rank r exchanges with
// partner r xor h; each keeps the aligned half of its current chunk range that
// contains its own index, sends its partial sums of the other half into the
// partner's scratch, and adds what the partner sent. After log2(p) steps rank
// r holds chunk r fully reduced (each chunk is reduced on one rank only, so
// all ranks get bit-identical results); the all-gather retraces the steps
// with h = 1, 2, ..., p/2. 2 log2(p) hops; each rank sends 2(p-1)/p of the data.
//
// Other rank counts (a documented fallback, not an error): p is the largest
// power of two below n; each extra rank r >= p first sends its input to rank
// r - p, which adds it before the exchange, and receives the finished output
// from rank r - p at the end (two more hops for those pairs).
//
// Ranks differ by more than a rotation (the partner is r xor h): the compiler
// shares one code path between them through rank-indexed tables (codegen.hpp).
#include <mk/dsl.hpp>

using namespace mk::dsl;

static void allreduce_halving_doubling(Program& p) {
  const int n = p.ranks();
  int pw = 1;
  while (pw * 2 <= n) pw *= 2;
  p.chunks(pw);
  p.instances(2);
  if (n == 1) {
    p.copy(p.output(0, 0), p.input(0, 0));
    return;
  }
  const int extra = n - pw;
  // Scratch slots: [0, pw) an extra rank's input, [pw, 2pw) its sum with the
  // partner's input (only with extra ranks); then per step with half size h,
  // h slots received and h partial sums (2pw - 2 in all).
  const int pre = extra ? 2 * pw : 0;
  auto recv_base = [&](int h) { return pre + pw - 2 * h; };
  auto acc_base = [&](int h) { return pre + 2 * pw - 2 * h; };
  for (int r = pw; r < n; ++r) p.copy(p.scratch(r - pw, 0, pw), p.input(r, 0, pw));
  for (int r = 0; r < extra; ++r) p.reduce(p.scratch(r, pw, pw), {p.input(r, 0, pw), p.scratch(r, 0, pw)});
  // Rank r's partial sums of chunks [c, c + cnt) before the step with half size h.
  auto partial = [&](int r, int h, int c, int cnt) {
    if (h == pw / 2) return r < extra ? p.scratch(r, pw + c, cnt) : p.input(r, c, cnt);
    const int lo = r & ~(2 * h - 1);  // the range r kept at the previous step
    return p.scratch(r, acc_base(2 * h) + c - lo, cnt);
  };
  for (int h = pw / 2; h >= 1; h /= 2) {
    for (int r = 0; r < pw; ++r) {
      const int q = r ^ h;
      p.copy(p.scratch(q, recv_base(h), h), partial(r, h, q & ~(h - 1), h));
    }
    for (int r = 0; r < pw; ++r) {
      const int lo = r & ~(h - 1);  // the half r keeps
      const Chunk sum = h == 1 ? p.output(r, r) : p.scratch(r, acc_base(h), h);
      p.reduce(sum, {partial(r, h, lo, h), p.scratch(r, recv_base(h), h)});
    }
  }
  // All-gather: rank r holds the aligned range of h chunks around r and sends
  // it to partner r xor h.
  for (int h = 1; h < pw; h *= 2)
    for (int r = 0; r < pw; ++r) {
      const int lo = r & ~(h - 1);
      p.copy(p.output(r ^ h, lo, h), p.output(r, lo, h));
    }
  for (int r = pw; r < n; ++r) p.copy(p.output(r, 0, pw), p.output(r - pw, 0, pw));
}

MK_SCHEDULE("allreduce.halving_doubling", allreduce, allreduce_halving_doubling,
            "recursive halving reduce-scatter then recursive doubling all-gather; 2 log2(n) hops");
