// A group's view of the caller's bootstrap: the same collectives, with whatever the caller's throw turned
// into BootstrapError naming this rank and the collective, so that every call of a group, its creation and
// the CPU reference's dispatch and combine included, throws a rocep::Error.
#pragma once

#include <cstddef>
#include <memory>

#include "rocep/bootstrap.hpp"

namespace rocep {

class GuardedBootstrap final : public Bootstrap {
 public:
  // rank() and size() are read once, here: fixed for a bootstrap's lifetime (bootstrap.hpp).
  explicit GuardedBootstrap(std::shared_ptr<Bootstrap> caller);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override;
  void barrier() override;
  bool barrier_within(double timeout_seconds) override;
  bool all_gather_within(const void* mine, void* all, std::size_t bytes_per_rank,
                         double timeout_seconds) override;

 private:
  template <typename Collective>
  auto guarded(const char* name, Collective&& collective);

  std::shared_ptr<Bootstrap> caller_;
  int rank_;
  int size_;
};

}  // namespace rocep
