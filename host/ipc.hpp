// Sharing device buffers between the processes of one node: export a handle, send its bytes through the
// bootstrap, open it in the peer. A buffer is named by (allocation, offset): the runtimes hand out small
// buffers from larger pooled allocations, and an imported handle always maps the start of its allocation,
// not the buffer inside it (seen on H200: a peer's flag store landed elsewhere and the flag never arrived).
// So the exporter names the allocation that holds the buffer (its base, from hipMemGetAddressRange) and the
// buffer's offset in it; the importer maps the allocation and adds the offset. Any DeviceBuffer can be
// shared, of any size.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "device_memory.hpp"
#include "hip/platform.hpp"
#include "rocep/bootstrap.hpp"

namespace rocep {

// What travels between processes to name one buffer.
struct IpcBufferHandle {
  hipIpcMemHandle_t handle;  // of the runtime allocation that holds the buffer (exported at its base)
  std::size_t offset;        // of the buffer from the allocation's base
  std::size_t bytes;         // of the buffer (so the importer can bound its accesses)
};

// Throws ConfigError for an empty buffer, GpuRuntimeError if the runtime refuses.
IpcBufferHandle export_ipc(const DeviceBuffer& buffer);

// A peer's buffer mapped into this process. Mappings of buffers that share an allocation share one opened
// handle (the runtimes refuse to open a handle twice in one process), closed with the last of them.
class IpcMapping {
 public:
  IpcMapping() = default;
  explicit IpcMapping(const IpcBufferHandle& handle);
  ~IpcMapping();
  IpcMapping(IpcMapping&& other) noexcept
      : allocation_(std::exchange(other.allocation_, nullptr)),
        pointer_(std::exchange(other.pointer_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  IpcMapping& operator=(IpcMapping&& other) noexcept {
    std::swap(allocation_, other.allocation_);
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;

  void* get() const { return pointer_; }  // the buffer: the mapped allocation plus the offset
  std::size_t bytes() const { return bytes_; }

 private:
  void* allocation_ = nullptr;  // the peer's allocation as mapped here
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

// Collective over `bootstrap`: exports `local` and returns every rank's handle (entry r: rank r's). Not
// failure-atomic (a rank whose export fails throws alone): for tools and tests; EpGroup agrees on each step.
std::vector<IpcBufferHandle> gather_ipc_handles(Bootstrap& bootstrap, const DeviceBuffer& local);

// Every peer's buffer mapped into this process: entry i is rank i's buffer as seen from here; this rank's
// own entry is `local` itself (no mapping). The mappings are closed when this is destroyed.
class PeerBuffers {
 public:
  // handles[r]: rank r's exported buffer (gathered from every rank).
  PeerBuffers(const std::vector<IpcBufferHandle>& handles, int rank, const DeviceBuffer& local);
  const std::vector<void*>& pointers() const { return pointers_; }
  void* operator[](int rank) const { return pointers_[rank]; }

 private:
  std::vector<IpcMapping> mappings_;
  std::vector<void*> pointers_;
};

}  // namespace rocep
