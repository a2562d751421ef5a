// rocep over MPI: the only rocep header that includes <mpi.h>. Header-only, so librocep itself does not
// link MPI; a program that includes this header links MPI as it does for its own MPI calls
// (find_package(MPI) and MPI::MPI_CXX in CMake).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "bootstrap.hpp"
#include "ep_group.hpp"
#include "errors.hpp"

namespace rocep {

// Throws BootstrapError naming `what` and MPI's message when `code` is not MPI_SUCCESS.
inline void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) {
    return;
  }
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw BootstrapError(std::string(what) + " failed: " + std::string(text, length));
}

// A Bootstrap over an MPI communicator. Owns a duplicate of it (with errors returned, not fatal), so
// rocep's traffic never matches the application's messages. MPI must be initialised first.
class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm) {
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
  // Frees the duplicate unless MPI is finalised or a bounded collective gave up on it (freeing a
  // communicator with a collective pending is not allowed: it is then left to MPI_Finalize).
  ~MpiBootstrap() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !abandoned_ && comm_ != MPI_COMM_NULL) {
      MPI_Comm_free(&comm_);
    }
  }
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    // MPI forbids overlapping send and receive buffers, and MPI_IN_PLACE would have to be chosen by every
    // rank alike; a private copy of the contribution avoids both.
    const std::vector<unsigned char> contribution = copy_of(mine, bytes_per_rank, "all_gather");
    const int count = static_cast<int>(bytes_per_rank);
    check_mpi(MPI_Allgather(contribution.data(), count, MPI_BYTE, all, count, MPI_BYTE, comm_),
              "MPI_Allgather");
  }

  bool all_gather_within(const void* mine, void* all, std::size_t bytes_per_rank,
                         double timeout_seconds) override {
    // MPI may still use both buffers of a request given up on: they are kept until the bootstrap goes.
    std::vector<unsigned char> contribution = copy_of(mine, bytes_per_rank, "all_gather_within");
    std::vector<unsigned char> gathered(bytes_per_rank * static_cast<std::size_t>(size_));
    const int count = static_cast<int>(bytes_per_rank);
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(contribution.data(), count, MPI_BYTE, gathered.data(), count, MPI_BYTE, comm_,
                             &request),
              "MPI_Iallgather");
    if (!completes_within(request, timeout_seconds)) {
      given_up_buffers_.push_back(std::move(contribution));
      given_up_buffers_.push_back(std::move(gathered));
      return false;
    }
    if (!gathered.empty()) {
      std::memcpy(all, gathered.data(), gathered.size());
    }
    return true;
  }

  void barrier() override { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

  bool barrier_within(double timeout_seconds) override {
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    return completes_within(request, timeout_seconds);
  }

  MPI_Comm comm() const { return comm_; }

 private:
  // `bytes` bytes at `mine`, copied; BootstrapError naming `call` where MPI's int count cannot hold them.
  static std::vector<unsigned char> copy_of(const void* mine, std::size_t bytes, const char* call) {
    if (bytes > static_cast<std::size_t>(INT32_MAX)) {
      throw BootstrapError(std::string("MpiBootstrap::") + call + ": " + std::to_string(bytes) +
                           " bytes per rank exceeds int");
    }
    const auto* first = static_cast<const unsigned char*>(mine);
    return std::vector<unsigned char>(first, first + bytes);
  }

  // Whether `request` completes within `timeout_seconds`; a request given up on is left pending, and the
  // communicator with it (abandoned_).
  bool completes_within(MPI_Request& request, double timeout_seconds) {
    const double deadline = MPI_Wtime() + timeout_seconds;
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

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool abandoned_ = false;                                    // a bounded collective never completed
  std::vector<std::vector<unsigned char>> given_up_buffers_;  // of all-gathers given up on
  int rank_ = 0;
  int size_ = 1;
};

// EpGroup over an MpiBootstrap of `comm` (declared in ep_group.hpp).
template <typename MpiComm, typename>
EpGroup::EpGroup(MpiComm comm, const EpConfig& config, Backend backend)
    : EpGroup(std::make_shared<MpiBootstrap>(comm), config, backend) {
  static_assert(std::is_convertible_v<MpiComm, MPI_Comm>, "EpGroup(comm, config, backend) takes an MPI_Comm");
}

}  // namespace rocep
