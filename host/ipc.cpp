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

PeerBuffers::PeerBuffers(Bootstrap& node, const DeviceBuffer& local) {
  const IpcBufferHandle mine = export_ipc(local);
  std::vector<IpcBufferHandle> handles(node.size());
  node.all_gather(&mine, handles.data(), sizeof mine);
  mappings_.resize(node.size());
  pointers_.resize(node.size());
  for (int peer = 0; peer < node.size(); ++peer) {
    if (peer == node.rank()) {
      pointers_[peer] = local.get();
    } else {
      mappings_[peer] = IpcMapping(handles[peer]);
      pointers_[peer] = mappings_[peer].get();
    }
  }
}

}  // namespace rocep
