// GoogleTest main for tests that run under mpirun: only rank 0 prints the usual report, a failure on any
// other rank is printed with its rank, and the exit status is the worst over all ranks, so ctest fails
// when any rank fails.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

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

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  } else {
    std::printf("Running on %d MPI rank(s)\n", size);
  }
  const int local_status = RUN_ALL_TESTS();
  int worst_status = 0;
  MPI_Allreduce(&local_status, &worst_status, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && worst_status != 0 && local_status == 0) {
    std::printf("Rank 0 passed, but a test failed on another rank (see the [rank N] lines above)\n");
  }
  MPI_Finalize();
  return worst_status;
}
