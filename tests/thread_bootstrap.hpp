// A Bootstrap whose ranks are threads of one process: groups created over it need no MPI at all. Tests use
// it to show that nothing in rocep depends on the MPI bootstrap.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "rocep/bootstrap.hpp"

namespace rocep::testing {

// What the threads of one group share: a barrier and the all-gather's buffer.
class ThreadRendezvous {
 public:
  explicit ThreadRendezvous(int size) : size_(size) {}

  int size() const { return size_; }

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation; });
  }

  // Every thread's bytes into the shared buffer, a barrier, every thread's copy out, a barrier (so that no
  // thread's next all-gather overwrites what another has yet to copy).
  void all_gather(int rank, const void* mine, void* all, std::size_t bytes) {
    const std::vector<uint8_t> contribution(static_cast<const uint8_t*>(mine),
                                            static_cast<const uint8_t*>(mine) + bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (gathered_.size() < bytes * size_) {
        gathered_.resize(bytes * size_);
      }
      std::copy(contribution.begin(), contribution.end(), gathered_.begin() + bytes * rank);
    }
    barrier();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bytes > 0) {
        std::memcpy(all, gathered_.data(), bytes * size_);
      }
    }
    barrier();
  }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<uint8_t> gathered_;
};

class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(std::shared_ptr<ThreadRendezvous> rendezvous, int rank)
      : rendezvous_(std::move(rendezvous)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return rendezvous_->size(); }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    rendezvous_->all_gather(rank_, mine, all, bytes_per_rank);
  }
  void barrier() override { rendezvous_->barrier(); }

 private:
  std::shared_ptr<ThreadRendezvous> rendezvous_;
  int rank_;
};

}  // namespace rocep::testing
