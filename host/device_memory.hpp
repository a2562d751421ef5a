// Move-only owners of GPU resources. Destructors never throw: a failed free is ignored, since the process
// is usually tearing down a failed runtime by then.
#pragma once

#include <cstddef>
#include <utility>

#include "hip/platform.hpp"

namespace rocep {

// Which memory a buffer is, by who touches it while kernels run (docs/design.md, "Memory regions and who
// writes them", gives the argument per region).
enum class DeviceMemoryKind {
  // Only this GPU's kernels (and the host between them): ordinary device memory, coarse-grained on AMD.
  kLocal,
  // A peer GPU stores into it, loads from it or polls it while kernels run (the group's dispatch and combine
  // regions and its signals). On AMD uncached where the runtime defines hipDeviceMallocUncached, else
  // (ROCm 5.2) fine-grained: coarse-grained lines may sit in a GPU's L2, dirty or stale, where the peers'
  // release / acquire sequences do not reach them. On NVIDIA ordinary device memory, allocated exactly as
  // kLocal: it is coherent for system-scope operations already.
  kPeerVisible,
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes, DeviceMemoryKind kind = DeviceMemoryKind::kLocal);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return pointer_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }
  std::size_t bytes() const { return bytes_; }
  // Gives the memory up without freeing it: for memory a peer may still store into (a group that timed
  // out), which must not be handed out again by the allocator while this process lives.
  void leak() {
    pointer_ = nullptr;
    bytes_ = 0;
  }

 private:
  void swap(DeviceBuffer& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
  }
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

// Page-locked host memory (fast copies, host-visible status words).
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  explicit PinnedHostBuffer(std::size_t bytes);
  ~PinnedHostBuffer();
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept { swap(other); }
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept {
    PinnedHostBuffer(std::move(other)).swap(*this);
    return *this;
  }
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* get() const { return pointer_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void swap(PinnedHostBuffer& other) noexcept {
    std::swap(pointer_, other.pointer_);
    std::swap(bytes_, other.bytes_);
  }
  void* pointer_ = nullptr;
  std::size_t bytes_ = 0;
};

// A non-blocking stream (does not synchronise with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    std::swap(stream_, other.stream_);
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  hipStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  hipStream_t stream_ = nullptr;
};

class Event {
 public:
  Event();  // records timing, for elapsed_ms_since
  ~Event();
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  hipEvent_t get() const { return event_; }
  void record(hipStream_t stream) const;
  void synchronize() const;
  // Milliseconds from `start` to this event; both must have completed.
  float elapsed_ms_since(const Event& start) const;

 private:
  hipEvent_t event_ = nullptr;
};

}  // namespace rocep
