// The one bounded spin every wait of a kernel goes through (flag waits, LL
// packets, zero-copy mailboxes): poll back to back, and every
// kSpinCheckInterval polls ask whether to stop (the communicator's abort word,
// the host's abort, the watchdog's timeout).
#pragma once
#include "vec.cuh"

#if MK_DEVICE_CODE
namespace mk {
namespace dev {

// Polls between two checks of the abort words and the clock: a check reads
// two words that usually sit in other caches, a poll one that is about to
// change.
constexpr uint32_t kSpinCheckInterval = 1024;

// True once ready(); false when stop(t0) said so (t0: when the spin began,
// for the timeout and the report, in *waited_from).
template <class Ready, class Stop>
MK_DEV bool bounded_spin(Ready ready, Stop stop, uint64_t* waited_from) {
  if (ready()) return true;
  const uint64_t t0 = globaltimer();
  for (uint32_t spins = 1;; ++spins) {
    if (ready()) return true;
    if (spins % kSpinCheckInterval == 0 && stop(t0)) {
      *waited_from = t0;
      return false;
    }
  }
}

}  // namespace dev
}  // namespace mk
#endif
