// Sharing device buffers between the processes of one node: export a handle, send its bytes through the
// bootstrap, open it in the peer. The mapping is closed when its owner is destroyed.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "device_memory.hpp"
#include "hip/platform.hpp"
#include "rocep/bootstrap.hpp"

namespace rocep {

// Bytes to allocate for a buffer that will be exported: whole 2 MiB units. The runtimes pool smaller
// allocations, and an imported handle maps the start of the pooled block, not the buffer inside it (seen on
// H200: a peer's flag store landed elsewhere and the flag never arrived). A buffer of whole units is its
// own block, so the importer's pointer is the buffer itself.
inline constexpr std::size_t kIpcGranularity = std::size_t{2} << 20;
inline std::size_t ipc_allocation_bytes(std::size_t bytes) {
  return (bytes + kIpcGranularity - 1) / kIpcGranularity * kIpcGranularity;
}

// What travels between processes to name one buffer: the runtime's handle plus the buffer's size (so the
// importer can bound its accesses).
struct IpcBufferHandle {
  hipIpcMemHandle_t handle;
  std::size_t bytes;
};

// Throws ConfigError unless the buffer was allocated with ipc_allocation_bytes().
IpcBufferHandle export_ipc(const DeviceBuffer& buffer);

// A peer's buffer mapped into this process.
class IpcMapping {
 public:
  IpcMapping() = default;
  explicit IpcMapping(const IpcBufferHandle& handle);
  ~IpcMapping();
  IpcMapping(IpcMapping&& other) noexcept
      : pointer_(std::exchange(other.pointer_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  IpcMapping& operator=(IpcMapping&& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;

  void* get() const { return pointer_; }
  std::size_t bytes() const { return bytes_; }

 private:
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
