#include "bench/data.hpp"

namespace mkb {

int dtype_kind(mk::DType t) {
  switch (t) {
    case mk::DType::int8:
    case mk::DType::uint8:
    case mk::DType::int32:
    case mk::DType::uint32:
    case mk::DType::int64:
    case mk::DType::uint64: return 0;
    case mk::DType::fp16: return 1;
    case mk::DType::bf16: return 2;
    case mk::DType::fp32: return 3;
    case mk::DType::fp64: return 4;
    case mk::DType::fp8e4m3:
    case mk::DType::fp8e5m2: return -1;
  }
  return -1;
}

std::string kernel_source() {
  std::string s =
      "#define MKB_HD __device__ __forceinline__\n"
      "namespace mkb {\n";
  s += mkb_shared_source();
  s += R"(
__device__ unsigned long long load_bits(const void* p, long long e, int bytes) {
  switch (bytes) {
    case 1: return ((const unsigned char*)p)[e];
    case 2: return ((const unsigned short*)p)[e];
    case 4: return ((const unsigned int*)p)[e];
    default: return ((const unsigned long long*)p)[e];
  }
}
__device__ void store_bits(void* p, long long e, int bytes, unsigned long long v) {
  switch (bytes) {
    case 1: ((unsigned char*)p)[e] = (unsigned char)v; break;
    case 2: ((unsigned short*)p)[e] = (unsigned short)v; break;
    case 4: ((unsigned int*)p)[e] = (unsigned int)v; break;
    default: ((unsigned long long*)p)[e] = v; break;
  }
}
}  // namespace mkb

// Rank `rank`'s input of set `set`: n elements.
extern "C" __global__ void mkb_fill(void* dst, long long n, unsigned rank, unsigned set, int K, int kind, int bytes) {
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
    mkb::store_bits(dst, e, bytes, mkb::to_bits(mkb::units(rank, e, set, K), kind, bytes));
}

// Checks nblocks x count output elements. srcs[2b], srcs[2b+1]: output block
// b is input block srcs[2b+1] of rank srcs[2b], or (srcs[2b] == -1) its sum
// over all ranks. result[0] += mismatches; result[1] = min(bad element).
extern "C" __global__ void mkb_check(const void* out, long long count, int nblocks, const int* srcs, int nranks,
                                     unsigned set, int K, int kind, int bytes, unsigned long long* result) {
  const long long total = count * nblocks;
  unsigned long long bad = 0, first = ~0ull;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const int b = int(e / count);
    const long long i = e - (long long)b * count;
    const int from = srcs[2 * b];
    const long long idx = (long long)srcs[2 * b + 1] * count + i;
    long long u = 0;
    if (from < 0)
      for (int r = 0; r < nranks; ++r) u += mkb::units(r, idx, set, K);
    else
      u = mkb::units(from, idx, set, K);
    if (mkb::load_bits(out, e, bytes) != mkb::to_bits(u, kind, bytes)) {
      ++bad;
      if ((unsigned long long)e < first) first = e;
    }
  }
  if (bad) {
    atomicAdd(&result[0], bad);
    atomicMin(&result[1], first);
  }
}
)";
  return s;
}

unsigned long long expected_bits(mk::Collective c, mk::DType t, int nranks, int root, int rank, int64_t count,
                                 int64_t elem, unsigned set) {
  const int K = unit_range(nranks);
  const auto src = mk::output_source(c, root, rank, int(elem / count));
  const long long idx = (long long)src.in_block * count + elem % count;
  long long u = 0;
  if (src.from == mk::BlockSource::kAllRanks)
    for (int r = 0; r < nranks; ++r) u += units(unsigned(r), (unsigned long long)idx, set, K);
  else
    u = units(unsigned(src.from), (unsigned long long)idx, set, K);
  return to_bits(u, dtype_kind(t), int(mk::dtype_size(t)));
}

}  // namespace mkb
