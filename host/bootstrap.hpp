// The one seam behind which inter-process exchange lives: an all-gather of bytes and a barrier. Everything
// that sets a group up (IPC handles, config agreement) goes through it, so tests can run it in one process.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>

namespace rocep {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank passes `bytes` bytes; `received` gets size() * bytes, rank i's at offset i * bytes.
  virtual void all_gather(const void* sent, void* received, std::size_t bytes) = 0;
  virtual void barrier() = 0;
};

// A group of exactly one rank (tests, single-GPU servers).
class SingleProcessBootstrap final : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_gather(const void* sent, void* received, std::size_t bytes) override;
  void barrier() override {}
};

// MPI implementation. Owns a duplicate of the communicator (errors returned, not fatal) so rocep's traffic
// never matches the application's messages.
class MpiBootstrap final : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm);
  ~MpiBootstrap() override;
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* sent, void* received, std::size_t bytes) override;
  void barrier() override;
  // A barrier that gives up after `seconds` (a peer may be gone): returns whether every rank arrived. If
  // not, the communicator is left alive (freeing it with a collective pending is not allowed).
  bool barrier_within(double seconds);

  // The ranks of this group that share this node's memory (MPI_Comm_split_type shared), ordered by rank in
  // this group. Collective over this group.
  std::unique_ptr<MpiBootstrap> split_node() const;

  MPI_Comm comm() const { return comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool abandoned_ = false;  // a timed barrier never completed
  int rank_ = 0;
  int size_ = 1;
};

// Throws BootstrapError naming `what` and MPI's message when `code` is not MPI_SUCCESS.
void check_mpi(int code, const char* what);

// The GPU a rank uses: its rank on the node modulo the devices it sees, unless `override_text` (the
// ROCEP_DEVICE environment variable) names a device. Throws ConfigError for an override that is not a
// device index in [0, device_count).
int device_for_local_rank(int local_rank, int device_count, const char* override_text);

}  // namespace rocep
