#include "ipc.hpp"

#include <cstdint>
#include <mutex>
#include <string>

#include "gpu_check.hpp"
#include "rocep/errors.hpp"

namespace rocep {

namespace {

// The peers' allocations opened in this process, each with the number of IpcMappings that use it: buffers
// of one peer that share an allocation arrive with equal handles, and the runtimes refuse to open a handle
// twice in one process (CUDA: "resource already mapped").
struct OpenedAllocation {
  std::string handle;  // the handle's bytes
  void* base;          // the allocation as mapped here
  int users;
};

struct OpenedAllocations {
  std::mutex mutex;
  std::vector<OpenedAllocation> entries;
};

OpenedAllocations& opened_allocations() {
  static auto* opened = new OpenedAllocations;  // never destroyed: a mapping may outlive static destructors
  return *opened;
}

void* open_allocation(const hipIpcMemHandle_t& handle) {
  const std::string key(reinterpret_cast<const char*>(&handle), sizeof handle);
  OpenedAllocations& opened = opened_allocations();
  const std::lock_guard<std::mutex> lock(opened.mutex);
  for (OpenedAllocation& entry : opened.entries) {
    if (entry.handle == key) {
      ++entry.users;
      return entry.base;
    }
  }
  void* base = nullptr;
  ROCEP_GPU_CHECK(hipIpcOpenMemHandle(&base, handle, hipIpcMemLazyEnablePeerAccess));
  opened.entries.push_back(OpenedAllocation{key, base, 1});
  return base;
}

void close_allocation(void* base) {
  OpenedAllocations& opened = opened_allocations();
  const std::lock_guard<std::mutex> lock(opened.mutex);
  for (auto entry = opened.entries.begin(); entry != opened.entries.end(); ++entry) {
    if (entry->base == base) {
      if (--entry->users == 0) {
        (void)hipIpcCloseMemHandle(base);
        opened.entries.erase(entry);
      }
      return;
    }
  }
}

}  // namespace

IpcBufferHandle export_ipc(const DeviceBuffer& buffer) {
  if (buffer.get() == nullptr) {
    throw ConfigError("export_ipc: an empty buffer cannot be shared");
  }
  void* base = nullptr;
  std::size_t allocation_bytes = 0;
  ROCEP_GPU_CHECK(hipMemGetAddressRange(&base, &allocation_bytes, buffer.get()));
  IpcBufferHandle exported{};  // zeroed: bytes the runtime leaves unset are equal in equal handles
  exported.offset =
      static_cast<std::size_t>(static_cast<const uint8_t*>(buffer.get()) - static_cast<const uint8_t*>(base));
  exported.bytes = buffer.bytes();
  if (exported.offset + exported.bytes > allocation_bytes) {
    throw GpuRuntimeError("export_ipc: a buffer of " + std::to_string(exported.bytes) + " bytes at offset " +
                          std::to_string(exported.offset) + " does not fit the allocation of " +
                          std::to_string(allocation_bytes) + " bytes the runtime reports for it");
  }
  ROCEP_GPU_CHECK(hipIpcGetMemHandle(&exported.handle, base));
  return exported;
}

IpcMapping::IpcMapping(const IpcBufferHandle& handle)
    : allocation_(open_allocation(handle.handle)),
      pointer_(static_cast<uint8_t*>(allocation_) + handle.offset),
      bytes_(handle.bytes) {}

IpcMapping::~IpcMapping() {
  if (allocation_ != nullptr) {
    try {
      close_allocation(allocation_);
    } catch (...) {
      // a lock that cannot be taken: the mapping stays open until the process exits
    }
  }
}

std::vector<IpcBufferHandle> gather_ipc_handles(Bootstrap& bootstrap, const DeviceBuffer& local) {
  const IpcBufferHandle mine = export_ipc(local);
  std::vector<IpcBufferHandle> handles(bootstrap.size());
  bootstrap.all_gather(&mine, handles.data(), sizeof mine);
  return handles;
}

PeerBuffers::PeerBuffers(const std::vector<IpcBufferHandle>& handles, int rank, const DeviceBuffer& local) {
  const int world = static_cast<int>(handles.size());
  mappings_.resize(world);
  pointers_.resize(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) {
      pointers_[peer] = local.get();
    } else {
      mappings_[peer] = IpcMapping(handles[peer]);
      pointers_[peer] = mappings_[peer].get();
    }
  }
}

}  // namespace rocep
