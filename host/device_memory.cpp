#include "device_memory.hpp"

#include "gpu_check.hpp"

namespace rocep {

namespace {

void* allocate_device(std::size_t bytes, DeviceMemoryKind kind) {
  void* pointer = nullptr;
#if defined(ROCEP_PLATFORM_AMD)
  if (kind == DeviceMemoryKind::kPeerVisible) {
    // Uncached where the runtime has the flag; fine-grained on runtimes without it, such as ROCm 5.2.
#if defined(hipDeviceMallocUncached)
    ROCEP_GPU_CHECK(hipExtMallocWithFlags(&pointer, bytes, hipDeviceMallocUncached));
#else
    ROCEP_GPU_CHECK(hipExtMallocWithFlags(&pointer, bytes, hipDeviceMallocFinegrained));
#endif
    return pointer;
  }
#else
  (void)kind;  // NVIDIA: every kind is plain cudaMalloc
#endif
  ROCEP_GPU_CHECK(hipMalloc(&pointer, bytes));
  return pointer;
}

}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes, DeviceMemoryKind kind)
    : pointer_(bytes > 0 ? allocate_device(bytes, kind) : nullptr), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  if (pointer_ != nullptr) {
    (void)hipFree(pointer_);
  }
}

PinnedHostBuffer::PinnedHostBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) {
    ROCEP_GPU_CHECK(hipHostMalloc(&pointer_, bytes, hipHostMallocDefault));
  }
}

PinnedHostBuffer::~PinnedHostBuffer() {
  if (pointer_ != nullptr) {
    (void)hipHostFree(pointer_);
  }
}

Stream::Stream() {
  ROCEP_GPU_CHECK(hipStreamCreateWithFlags(&stream_, hipStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    (void)hipStreamDestroy(stream_);
  }
}

void Stream::synchronize() const {
  ROCEP_GPU_CHECK(hipStreamSynchronize(stream_));
}

Event::Event() {
  ROCEP_GPU_CHECK(hipEventCreateWithFlags(&event_, hipEventDefault));
}

Event::~Event() {
  if (event_ != nullptr) {
    (void)hipEventDestroy(event_);
  }
}

void Event::record(hipStream_t stream) const {
  ROCEP_GPU_CHECK(hipEventRecord(event_, stream));
}

void Event::synchronize() const {
  ROCEP_GPU_CHECK(hipEventSynchronize(event_));
}

float Event::elapsed_ms_since(const Event& start) const {
  float milliseconds = 0;
  ROCEP_GPU_CHECK(hipEventElapsedTime(&milliseconds, start.event_, event_));
  return milliseconds;
}

}  // namespace rocep
