#include "ipc.hpp"

#include <string>

#include "gpu_check.hpp"
#include "rocep/errors.hpp"

namespace rocep {

IpcBufferHandle export_ipc(const DeviceBuffer& buffer) {
  if (buffer.bytes() == 0 || buffer.bytes() % kIpcGranularity != 0) {
    throw ConfigError("export_ipc: a buffer of " + std::to_string(buffer.bytes()) +
                      " bytes cannot be shared safely: allocate ipc_allocation_bytes() bytes");
  }
  IpcBufferHandle exported{};
  ROCEP_GPU_CHECK(hipIpcGetMemHandle(&exported.handle, buffer.get()));
  exported.bytes = buffer.bytes();
  return exported;
}

IpcMapping::IpcMapping(const IpcBufferHandle& handle) : bytes_(handle.bytes) {
  ROCEP_GPU_CHECK(hipIpcOpenMemHandle(&pointer_, handle.handle, hipIpcMemLazyEnablePeerAccess));
}

IpcMapping::~IpcMapping() {
  if (pointer_ != nullptr) {
    (void)hipIpcCloseMemHandle(pointer_);
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
