// Bootstrap: how the ranks of a group find each other. rocep needs only an all-gather of bytes and a
// barrier: the GPU backend at group creation, close and teardown only (never during dispatch or combine),
// the CPU reference also within each dispatch_send and combine_send (its messages cross through
// all_gather). So any launcher can provide it: MPI (rocep/mpi.hpp), torch.distributed or mpi4py (the Python
// package), or a server's own channel. Their bounded forms (barrier_within, all_gather_within) are optional:
// where a bootstrap bounds them, a group's teardown and close give up on a missing peer after
// EpConfig::timeout_seconds.
#pragma once

#include <cstddef>
#include <cstring>

namespace rocep {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  // This process's rank in [0, size()) and the number of ranks. Fixed for the bootstrap's lifetime.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Collective: every rank passes `bytes_per_rank` bytes at `mine` (the same count on every rank); `all`
  // receives size() * bytes_per_rank bytes, rank i's at offset i * bytes_per_rank. `mine` may point into
  // `all`. Errors: throws (rocep::BootstrapError in rocep's own implementations) and never returns partial
  // data. Whatever a bootstrap's collective throws reaches the caller of a group's creation or call as
  // BootstrapError naming the rank and the collective.
  virtual void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) = 0;

  // Collective: returns once every rank has called it.
  virtual void barrier() = 0;

  // Collective, bounded: true once every rank has called it, false after `timeout_seconds` (a peer may be
  // gone). After a false return the bootstrap may not be usable for further collectives. The default waits
  // in barrier() without a bound and returns true: override it where the launcher can give up.
  virtual bool barrier_within(double timeout_seconds) {
    (void)timeout_seconds;
    barrier();
    return true;
  }

  // Collective, bounded: all_gather, true once `all` holds every rank's bytes, false after `timeout_seconds`
  // (a peer may be gone; `all` is then unspecified, and the bootstrap may not be usable for further
  // collectives). The default waits in all_gather() without a bound and returns true: override it where the
  // launcher can give up.
  virtual bool all_gather_within(const void* mine, void* all, std::size_t bytes_per_rank,
                                 double timeout_seconds) {
    (void)timeout_seconds;
    all_gather(mine, all, bytes_per_rank);
    return true;
  }
};

// A group of exactly one rank (single-GPU servers, tests).
class SingleProcessBootstrap final : public Bootstrap {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    if (bytes_per_rank > 0 && mine != all) {
      std::memmove(all, mine, bytes_per_rank);
    }
  }
  void barrier() override {}
};

}  // namespace rocep
