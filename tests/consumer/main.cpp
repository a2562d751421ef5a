// Dispatches one token per rank to every rank's first expert and combines it back with weight 1 on the
// CPU reference backend; the combined token must equal the original. Exits non-zero on any mismatch.
#include <mpi.h>
#include <rocep/mpi.hpp>
#include <rocep/rocep.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    rocep::EpConfig config;
    config.hidden = 64;
    config.num_experts = 2 * world;
    config.top_k = 1;
    config.max_tokens_per_rank = 1;
    rocep::EpGroup group(MPI_COMM_WORLD, config, rocep::Backend::kCpuReference);

    // bf16 bit patterns of small integers: exactly representable, and weight 1 keeps them exact.
    std::vector<uint16_t> token(config.hidden);
    for (int i = 0; i < config.hidden; ++i) {
      token[i] = static_cast<uint16_t>(0x3f80 + 0x10 * (i % 8) + group.rank());
    }
    const int32_t expert = (group.rank() * 2 + 2) % config.num_experts;  // the next rank's first expert
    const float weight = 1.0f;
    const std::size_t rows = group.max_recv_rows();
    std::vector<uint16_t> recv_tokens(rows * config.hidden);
    std::vector<uint32_t> row_offsets(group.num_local_experts() + 1);
    std::vector<int32_t> expert_ids(group.num_local_experts());
    std::vector<rocep::SrcInfo> src_info(rows);
    std::vector<float> recv_weights(rows);
    std::vector<uint16_t> combined(config.hidden);

    group.dispatch({token.data(), &expert, &weight, 1, nullptr},
                   {recv_tokens.data(), row_offsets.data(), expert_ids.data(), src_info.data(),
                    recv_weights.data(), nullptr});
    group.combine({recv_tokens.data(), recv_weights.data(), nullptr, combined.data()});
    if (combined != token) {
      std::fprintf(stderr, "rank %d: combined token differs from the dispatched one\n", group.rank());
      status = 1;
    } else if (group.rank() == 0) {
      const rocep::BuildInfo build = rocep::build_info();
      std::printf("rocep consumer: dispatch + combine round trip OK on %d rank(s), rocep %s (%s)\n", world,
                  build.version, build.gpu_platform);
    }
  } catch (const rocep::Error& error) {
    std::fprintf(stderr, "rocep consumer: %s\n", error.what());
    status = 1;
  }
  MPI_Finalize();
  return status;
}
