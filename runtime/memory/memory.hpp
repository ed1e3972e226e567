// Symmetric memory: one arena per rank and communicator, allocated with the
// CUDA virtual memory API (cuMemCreate) so it can be exported as a POSIX file
// descriptor and mapped into every peer on the node. Holds every plan's flag
// slots and scratch. Zeroed at creation (LL flags must not match garbage).
#pragma once

#include <cuda.h>

#include <cstddef>
#include <vector>

namespace mk::rt {

class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Allocates `size` bytes (rounded up to the granularity) on `device`,
  // readable and writable by `device`: the first `zeroed` bytes (flags)
  // zero, the rest (scratch) all ones, the sentinel of Lamport packets at
  // rest (templates/prims_lamport.cuh).
  void allocate(CUdevice device, size_t size, size_t zeroed);
  // Lets more devices of this process access it (several ranks per process).
  void grant(const std::vector<CUdevice>& devices);
  int export_fd() const;  // caller closes
  void release();
  // Forgets the memory without freeing it (kernels may still use it).
  void abandon() { base_ = 0; }
  CUdeviceptr base() const { return base_; }
  size_t size() const { return size_; }

 private:
  CUdevice device_ = 0;
  CUdeviceptr base_ = 0;
  size_t size_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
};

// A peer's arena mapped into this process for `device`.
class PeerMapping {
 public:
  PeerMapping() = default;
  ~PeerMapping();
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  void map(int fd, size_t size, CUdevice device);  // takes ownership of fd
  CUdeviceptr base() const { return base_; }

 private:
  CUdeviceptr base_ = 0;
  size_t size_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
};

size_t arena_granularity(CUdevice device);

}  // namespace mk::rt
