// GoogleTest main for tests that run under mpirun: only rank 0 prints the usual report, a failure on any
// other rank is printed with its rank, and the exit status is the worst over all ranks, so ctest fails
// when any rank fails. After every test the ranks agree on its outcome, so that a failure on one rank is
// reported by all, and a rank that left a test early (an ASSERT) or is stuck in it ends the run instead of
// leaving the others hanging in the next collective.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace {

// Prints failures of a rank other than 0 (whose default printer is removed), prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] FAILURE at %s:%d\n%s\n", rank_,
                   result.file_name() ? result.file_name() : "?", result.line_number(), result.summary());
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

// At the end of every test, every rank learns the lowest rank on which it failed, over a communicator of its
// own (so that it never matches a collective the test left pending on MPI_COMM_WORLD). The wait is bounded:
// ranks that do not all reach the end of the test within kAgreementSeconds abort the run, naming the test.
class OutcomeAgreement : public ::testing::EmptyTestEventListener {
 public:
  static constexpr double kAgreementSeconds = 120.0;

  OutcomeAgreement(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int mine = info.result()->Failed() ? rank_ : size_;
    int first_failed = size_;
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Iallreduce(&mine, &first_failed, 1, MPI_INT, MPI_MIN, comm_, &request);
    const double deadline = MPI_Wtime() + kAgreementSeconds;
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    while (!done) {
      if (MPI_Wtime() > deadline) {
        std::fprintf(stderr,
                     "[rank %d] test %s.%s: the ranks did not all finish it within %.0f s (one left it early "
                     "or is stuck in it); aborting the run\n",
                     rank_, info.test_suite_name(), info.name(), kAgreementSeconds);
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      // Ranks still in the test may share this rank's cores (CI runs 4 ranks on 2).
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (first_failed < size_ && !info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] test %s.%s failed on rank %d\n", rank_, info.test_suite_name(),
                   info.name(), first_failed);
    }
  }

 private:
  MPI_Comm comm_;
  int rank_;
  int size_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm agreement = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &agreement);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  } else {
    std::printf("Running on %d MPI rank(s)\n", size);
  }
  listeners.Append(new OutcomeAgreement(agreement, rank, size));
  const int local_status = RUN_ALL_TESTS();
  int worst_status = 0;
  MPI_Allreduce(&local_status, &worst_status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst_status != 0 && local_status == 0) {
    std::printf("Rank 0 passed, but a test failed on another rank (see the [rank N] lines above)\n");
  }
  MPI_Comm_free(&agreement);
  MPI_Finalize();
  return worst_status;
}
