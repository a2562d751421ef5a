#include "bootstrap.hpp"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "rocep/errors.hpp"

namespace rocep {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) {
    return;
  }
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw BootstrapError(std::string(what) + " failed: " + std::string(text, length));
}

void SingleProcessBootstrap::all_gather(const void* sent, void* received, std::size_t bytes) {
  if (bytes > 0 && sent != received) {
    std::memmove(received, sent, bytes);
  }
}

MpiBootstrap::MpiBootstrap(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    throw BootstrapError("MpiBootstrap: MPI is not initialised (call MPI_Init first)");
  }
  check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiBootstrap::~MpiBootstrap() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && !abandoned_ && comm_ != MPI_COMM_NULL) {
    MPI_Comm_free(&comm_);
  }
}

void MpiBootstrap::all_gather(const void* sent, void* received, std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw BootstrapError("MpiBootstrap::all_gather: " + std::to_string(bytes) +
                         " bytes per rank exceeds int");
  }
  const int count = static_cast<int>(bytes);
  // MPI forbids overlapping send and receive buffers, and MPI_IN_PLACE would have to be chosen by every
  // rank alike; a private copy of the contribution avoids both.
  const std::vector<uint8_t> contribution(static_cast<const uint8_t*>(sent),
                                          static_cast<const uint8_t*>(sent) + bytes);
  check_mpi(MPI_Allgather(contribution.data(), count, MPI_BYTE, received, count, MPI_BYTE, comm_),
            "MPI_Allgather");
}

void MpiBootstrap::barrier() {
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

bool MpiBootstrap::barrier_within(double seconds) {
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  const double deadline = MPI_Wtime() + seconds;
  int done = 0;
  while (!done) {
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!done && MPI_Wtime() > deadline) {
      abandoned_ = true;
      return false;
    }
  }
  return true;
}

std::unique_ptr<MpiBootstrap> MpiBootstrap::split_node() const {
  MPI_Comm node_comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  auto node = std::make_unique<MpiBootstrap>(node_comm);
  MPI_Comm_free(&node_comm);
  return node;
}

int device_for_local_rank(int local_rank, int device_count, const char* override_text) {
  if (device_count < 1) {
    throw ConfigError("device_for_local_rank: no GPU is visible (device count " +
                      std::to_string(device_count) + ")");
  }
  if (override_text == nullptr || *override_text == '\0') {
    return local_rank % device_count;
  }
  char* end = nullptr;
  const long device = std::strtol(override_text, &end, 10);
  const bool digits_only = std::isdigit(static_cast<unsigned char>(*override_text)) && *end == '\0';
  if (!digits_only || device < 0 || device >= device_count) {
    throw ConfigError(std::string("ROCEP_DEVICE = '") + override_text +
                      "' is invalid: allowed range is [0, " + std::to_string(device_count - 1) + "]");
  }
  return static_cast<int>(device);
}

}  // namespace rocep
