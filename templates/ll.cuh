// LL ("low latency") packets: 8 data bytes and two copies of a 32-bit flag in
// one 16-byte store {data.x, flag, data.y, flag}. A 16-byte store is seen
// whole, so a reader that sees both flags equal to the step's value also sees
// the data: no separate flag, no fence, no round trip.
#pragma once
#include "vec.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

MK_DEV void ll_store(void* packet, V8 data, uint32_t flag) {
  V16 p;
  p.x = data.x;
  p.y = flag;
  p.z = data.y;
  p.w = flag;
  st_volatile16(packet, p);
}

// One poll; true when the packet carries `flag`.
MK_DEV bool ll_try_load(const void* packet, uint32_t flag, V8* out) {
  V16 p = ld_volatile16(packet);
  if (p.y != flag || p.w != flag) return false;
  out->x = p.x;
  out->y = p.z;
  return true;
}

}  // namespace dev
}  // namespace mk
#endif
