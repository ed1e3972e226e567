// The fake libibverbs (tests/fake_ibverbs/fake_ibverbs.cpp, built as
// libmkt_fake_ibverbs.so): the RC subset of the verbs API that mKernel's
// verbs transport (runtime/transport/net/verbs.cpp) uses, across processes of
// one machine, for CI machines without an RDMA device. Loaded by path
// (MK_IBVERBS_LIB / VerbsOptions::lib); never linked, never installed. What it
// models and its environment: README.md beside this file.
//
// Control calls for tests, found with dlsym in the loaded library
// (mkfake_ib_fn below). QP numbers are those of ibv_qp::qp_num; 0 means every
// QP of the calling process.
#pragma once

#include <dlfcn.h>

#include <cstdint>

extern "C" {

struct mkfake_ib_counts {  // live objects of the calling process
  int contexts, pds, mrs, cqs, qps;
};

struct mkfake_ib_qp {  // what a QP was last set to (ibv_modify_qp)
  uint32_t qpn;
  int pid;          // owner
  int state;        // enum ibv_qp_state
  uint32_t dest_qpn;
  uint32_t sq_psn, rq_psn;
  int path_mtu;     // enum ibv_mtu
  int is_global;    // the address vector had a GRH
  int sgid_index;
  uint16_t dlid;
  uint8_t dgid[16];
};

// 1: this is the fake.
int mkfake_ib_is_fake(void);
// This process's live QPs, oldest first: how many there are (at most `max` written).
int mkfake_ib_qps(uint32_t* qpns, int max);
// 0 and `*out` filled, or -1 when no such QP lives (any process's QP).
int mkfake_ib_qp_info(uint32_t qpn, struct mkfake_ib_qp* out);
// The QP's next send completion comes back with `status` (an enum
// ibv_wc_status, e.g. IBV_WC_RETRY_EXC_ERR) and the QP goes into
// IBV_QPS_ERR, as a real one does: what is left is flushed. 0 or -1.
int mkfake_ib_fail_next_send(uint32_t qpn, int status);
// Moves the QP into IBV_QPS_ERR (as a fatal async error would): its posted
// work requests complete with IBV_WC_WR_FLUSH_ERR. 0 or -1.
int mkfake_ib_set_qp_error(uint32_t qpn);
void mkfake_ib_get_counts(struct mkfake_ib_counts* out);
}

// A control call of the fake loaded from `lib` (already loaded), or null.
template <class F>
F* mkfake_ib_fn(const char* lib, const char* name) {
  void* h = ::dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return nullptr;
  void* f = ::dlsym(h, name);
  ::dlclose(h);
  return reinterpret_cast<F*>(f);
}
