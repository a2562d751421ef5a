// EpConfig validation, the per-format byte counts, the derived sizes (local experts, receive rows), the
// dispatch and combine regions' layouts, the symmetric memory of groups that span nodes, and build_info. No
// MPI: every rank runs the same checks on its own.
#include "rocep/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>

#include "hip/ep_params.hpp"
#include "hip/scale_layout.hpp"
#include "host/comm_policy.hpp"
#include "host/shmem_sizes.hpp"
#include "rocep/build_info.hpp"
#include "rocep/errors.hpp"

namespace {

using rocep::EpConfig;
using rocep::TokenFormat;

TEST(EpConfigTest, DefaultConfigIsValidAtEveryPowerOfTwoWorld) {
  const EpConfig config;
  for (int world_size : {1, 2, 4, 8}) {
    SCOPED_TRACE("world_size " + std::to_string(world_size));
    EXPECT_NO_THROW(config.validate(world_size));
  }
}

TEST(EpConfigTest, EveryFormatAcceptsAHiddenOfWholeBlocks) {
  for (TokenFormat format : {TokenFormat::kBf16, TokenFormat::kFp8Block128, TokenFormat::kMxfp4,
                             TokenFormat::kNvfp4, TokenFormat::kMxfp8}) {
    SCOPED_TRACE(rocep::to_string(format));
    EpConfig config;
    config.dispatch_format = format;
    EXPECT_NO_THROW(config.validate(2));
  }
}

// One rejected configuration: `mutate` breaks one field of a default config, validate(world_size) must
// throw ConfigError whose message contains "<field> = <value>".
struct Rejection {
  const char* name;
  void (*mutate)(EpConfig&);
  int world_size;
  const char* field;
  const char* value;
};

class EpConfigRejectionTest : public ::testing::TestWithParam<Rejection> {};

TEST_P(EpConfigRejectionTest, ThrowsConfigErrorNamingFieldAndValue) {
  const Rejection& rejection = GetParam();
  EpConfig config;
  rejection.mutate(config);
  try {
    config.validate(rejection.world_size);
    ADD_FAILURE() << "validate(" << rejection.world_size << ") accepted " << config.describe();
  } catch (const rocep::ConfigError& error) {
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string(rejection.field) + " = " + rejection.value,
                        error.what());
  }
}

const Rejection kRejections[] = {
    {"HiddenZero", [](EpConfig& c) { c.hidden = 0; }, 2, "hidden", "0"},
    {"HiddenNegative", [](EpConfig& c) { c.hidden = -8; }, 2, "hidden", "-8"},
    {"HiddenTooLarge", [](EpConfig& c) { c.hidden = (1 << 16) + 8; }, 2, "hidden", "65544"},
    {"HiddenNotMultipleOf8ForBf16", [](EpConfig& c) { c.hidden = 7172; }, 2, "hidden", "7172"},
    {"HiddenNotMultipleOf128ForFp8Block128",
     [](EpConfig& c) {
       c.dispatch_format = TokenFormat::kFp8Block128;
       c.hidden = 7168 + 64;
     },
     2, "hidden", "7232"},
    {"HiddenNotMultipleOf32ForMxfp4",
     [](EpConfig& c) {
       c.dispatch_format = TokenFormat::kMxfp4;
       c.hidden = 7168 + 16;
     },
     2, "hidden", "7184"},
    {"HiddenNotMultipleOf64ForNvfp4",
     [](EpConfig& c) {
       c.dispatch_format = TokenFormat::kNvfp4;
       c.hidden = 7168 + 32;
     },
     2, "hidden", "7200"},
    {"Fp8EncodingUnknownCode", [](EpConfig& c) { c.fp8_encoding = static_cast<rocep::Fp8Encoding>(3); }, 2,
     "fp8_encoding", "3"},
    {"TopKZero", [](EpConfig& c) { c.top_k = 0; }, 2, "top_k", "0"},
    {"TopKAboveNumExperts", [](EpConfig& c) { c.top_k = 257; }, 2, "top_k", "257"},
    {"NumExpertsZero", [](EpConfig& c) { c.num_experts = 0; }, 2, "num_experts", "0"},
    {"NumExpertsNotDivisibleByWorld", [](EpConfig& c) { c.num_experts = 255; }, 2, "num_experts", "255"},
    {"MaxTokensPerRankZero", [](EpConfig& c) { c.max_tokens_per_rank = 0; }, 2, "max_tokens_per_rank", "0"},
    {"MaxTokensPerRankTooLarge", [](EpConfig& c) { c.max_tokens_per_rank = (1 << 16) + 1; }, 2,
     "max_tokens_per_rank", "65537"},
    {"GpusPerNodeNegative", [](EpConfig& c) { c.gpus_per_node = -1; }, 4, "gpus_per_node", "-1"},
    {"GpusPerNodeAboveWorld", [](EpConfig& c) { c.gpus_per_node = 8; }, 4, "gpus_per_node", "8"},
    {"GpusPerNodeNotDividingWorld", [](EpConfig& c) { c.gpus_per_node = 3; }, 4, "gpus_per_node", "3"},
    {"NumSmsBelowAllSms", [](EpConfig& c) { c.num_sms = -2; }, 2, "num_sms", "-2"},
    {"NumSmsTooLarge", [](EpConfig& c) { c.num_sms = (1 << 12) + 1; }, 2, "num_sms", "4097"},
    {"ExpertAlignmentZero", [](EpConfig& c) { c.expert_alignment = 0; }, 2, "expert_alignment", "0"},
    {"TimeoutZero", [](EpConfig& c) { c.timeout_seconds = 0.0; }, 2, "timeout_seconds", "0"},
    {"TimeoutNegative", [](EpConfig& c) { c.timeout_seconds = -1.5; }, 2, "timeout_seconds", "-1.5"},
    {"TimeoutNaN", [](EpConfig& c) { c.timeout_seconds = std::numeric_limits<double>::quiet_NaN(); }, 2,
     "timeout_seconds", "nan"},
    {"TimeoutInfinite", [](EpConfig& c) { c.timeout_seconds = std::numeric_limits<double>::infinity(); }, 2,
     "timeout_seconds", "inf"},
    {"DispatchFormatUnknownCode", [](EpConfig& c) { c.dispatch_format = static_cast<TokenFormat>(9); }, 2,
     "dispatch_format", "9"},
    {"CombineDtypeUnknownCode", [](EpConfig& c) { c.combine_dtype = static_cast<rocep::CombineDtype>(3); }, 2,
     "combine_dtype", "3"},
    {"WorldSizeZero", [](EpConfig&) {}, 0, "world_size", "0"},
    // 2 x 65536 x 16384 row indices: past int32.
    {"RowIndicesPastInt32",
     [](EpConfig& c) {
       c.num_experts = 1 << 14;
       c.top_k = 1 << 14;
       c.max_tokens_per_rank = 1 << 16;
     },
     2, "top_k", "16384"},
};

INSTANTIATE_TEST_SUITE_P(Fields, EpConfigRejectionTest, ::testing::ValuesIn(kRejections),
                         [](const ::testing::TestParamInfo<Rejection>& param_info) {
                           return param_info.param.name;
                         });

struct FormatSizes {
  TokenFormat format;
  int block_elements;
  std::size_t payload_bytes;
  std::size_t scale_bytes;
};

TEST(TokenFormatTest, SizesAtHidden7168) {
  constexpr int kHidden = 7168;
  const FormatSizes expected[] = {
      {TokenFormat::kBf16, 1, kHidden * 2, 0},
      {TokenFormat::kFp8Block128, 128, kHidden, kHidden / 128 * 4},  // 56 float32 scales
      {TokenFormat::kMxfp4, 32, kHidden / 2, kHidden / 32},          // 224 e8m0 scales
      {TokenFormat::kNvfp4, 16, kHidden / 2, kHidden / 16},          // 448 e4m3 scales
      {TokenFormat::kMxfp8, 32, kHidden, kHidden / 32},              // 224 e8m0 scales
  };
  for (const FormatSizes& sizes : expected) {
    SCOPED_TRACE(rocep::to_string(sizes.format));
    EXPECT_EQ(rocep::format_block_elements(sizes.format), sizes.block_elements);
    EXPECT_EQ(rocep::format_payload_bytes(sizes.format, kHidden), sizes.payload_bytes);
    EXPECT_EQ(rocep::format_scale_bytes(sizes.format, kHidden), sizes.scale_bytes);
  }
}

TEST(TokenFormatTest, UnknownFormatThrowsConfigError) {
  const auto unknown = static_cast<TokenFormat>(9);
  EXPECT_THROW(rocep::format_block_elements(unknown), rocep::ConfigError);
  EXPECT_THROW(rocep::format_payload_bytes(unknown, 7168), rocep::ConfigError);
  EXPECT_THROW(rocep::format_scale_bytes(unknown, 7168), rocep::ConfigError);
}

// A row length that is negative, half a byte of fp4, or part of a scale block is refused, naming it.
TEST(TokenFormatTest, RowLengthsWithoutWholeBytesOrBlocksThrowConfigError) {
  const auto message = [](auto size) {
    try {
      size();
    } catch (const rocep::ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "hidden = -1 is invalid for format bf16",
                      message([] { return rocep::format_payload_bytes(TokenFormat::kBf16, -1); }));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "hidden = 33 is invalid for format mxfp4",
                      message([] { return rocep::format_payload_bytes(TokenFormat::kMxfp4, 33); }));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "multiples of 128",
                      message([] { return rocep::format_scale_bytes(TokenFormat::kFp8Block128, 100); }));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "columns = -64 is invalid for format nvfp4",
                      message([] { return rocep::format_scale_tensor_bytes(TokenFormat::kNvfp4, 10, -64); }));
  // nvfp4's tiles take whole 4-block columns: 16 or 80 columns have blocks with no place in a smaller tensor.
  EXPECT_PRED_FORMAT2(::testing::IsSubstring,
                      "columns = 80 is invalid for format nvfp4: allowed values are "
                      "non-negative multiples of 64",
                      message([] { return rocep::format_scale_tensor_bytes(TokenFormat::kNvfp4, 128, 80); }));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "columns = 16 is invalid for format nvfp4",
                      message([] { return rocep::format_scale_tensor_bytes(TokenFormat::kNvfp4, 128, 16); }));
  EXPECT_PRED_FORMAT2(::testing::IsSubstring, "its scale tensor's bytes overflow size_t", message([] {
                        return rocep::format_scale_tensor_bytes(TokenFormat::kFp8Block128,
                                                                std::size_t{1} << 62, 1280);
                      }));
  EXPECT_EQ(rocep::format_payload_bytes(TokenFormat::kFp8Block128, 8), 8u);  // a part-row's bytes
  EXPECT_EQ(rocep::format_scale_bytes(TokenFormat::kBf16, 7), 0u);
}

// The scale layouts of formats.hpp, offsets worked out by hand.
TEST(TokenFormatTest, ScaleLayoutsPlaceEachScaleWhereTheHeaderSays) {
  using rocep::device::Format;
  using rocep::device::scale_offset;
  // fp8 block-128, 10 rows of 256: float32 [2][10], row 3 block 1 at (1 * 10 + 3) * 4.
  EXPECT_EQ(scale_offset(Format::kFp8Block128, 3, 1, 10, 256), 52u);
  EXPECT_EQ(rocep::format_scale_tensor_bytes(TokenFormat::kFp8Block128, 10, 256), 80u);
  // MX, 10 rows of 128: [10][4] bytes, row 3 block 2 at 3 * 4 + 2.
  EXPECT_EQ(scale_offset(Format::kMxfp4, 3, 2, 10, 128), 14u);
  EXPECT_EQ(scale_offset(Format::kMxfp8, 3, 2, 10, 128), 14u);
  EXPECT_EQ(rocep::format_scale_tensor_bytes(TokenFormat::kMxfp8, 10, 128), 40u);
  // nvfp4, 129 rows of 128 (8 blocks a row, 2 tiles of 4 blocks): row 161 block 6 lies in tile (1, 1) =
  // 3 * 512, at (161 % 32) * 16 + ((161 % 128) / 32) * 4 + 6 % 4 = 16 + 4 + 2.
  EXPECT_EQ(scale_offset(Format::kNvfp4, 161, 6, 200, 128), 3u * 512 + 22);
  EXPECT_EQ(scale_offset(Format::kNvfp4, 0, 0, 200, 128), 0u);
  EXPECT_EQ(scale_offset(Format::kNvfp4, 127, 3, 200, 128), 31u * 16 + 3 * 4 + 3);
  EXPECT_EQ(rocep::format_scale_tensor_bytes(TokenFormat::kNvfp4, 129, 128), 2u * 2 * 512);
  EXPECT_EQ(rocep::format_scale_tensor_bytes(TokenFormat::kBf16, 129, 128), 0u);
}

// The kernels' grouped form of the layouts (ScaleGroups) against scale_offset, the definition: every byte
// of every group of every row, for row counts past a tile and MX rows with and without whole words.
TEST(TokenFormatTest, ScaleGroupsPlaceEveryByteWhereScaleOffsetDoes) {
  using rocep::device::Format;
  for (const Format format : {Format::kFp8Block128, Format::kMxfp4, Format::kMxfp8, Format::kNvfp4}) {
    for (const int columns : {128, 160, 384, 7168}) {
      if (columns % rocep::format_column_multiple(static_cast<TokenFormat>(format)) != 0) {
        continue;
      }
      const std::size_t rows = 300;
      const rocep::device::ScaleGroups groups = rocep::device::scale_groups(format, rows, columns);
      const int scale_bytes = rocep::device::scale_bytes(format);
      const int blocks = columns / rocep::device::block_elements(format);
      ASSERT_EQ(groups.groups * groups.group_bytes, blocks * scale_bytes);
      for (uint32_t row = 0; row < rows; ++row) {
        for (int g = 0; g < groups.groups; ++g) {
          for (int byte = 0; byte < groups.group_bytes; ++byte) {
            // Byte `byte` of group g is byte (g * group_bytes + byte) of the row's row-major scales.
            const int position = g * groups.group_bytes + byte;
            const std::size_t expected =
                rocep::device::scale_offset(format, row, position / scale_bytes, rows, columns) +
                position % scale_bytes;
            ASSERT_EQ(groups.row_offset(row) + g * groups.group_stride + byte, expected)
                << "format " << static_cast<int>(format) << " columns " << columns << " row " << row
                << " group " << g << " byte " << byte;
          }
        }
      }
    }
  }
}

TEST(EpConfigTest, NumLocalExpertsSplitsExpertsEvenly) {
  EpConfig config;  // 256 experts
  EXPECT_EQ(config.num_local_experts(1), 256);
  EXPECT_EQ(config.num_local_experts(2), 128);
  EXPECT_EQ(config.num_local_experts(8), 32);
}

// The sizes a caller allocates by are refused for a config that validate refuses.
TEST(EpConfigTest, SizesOfAnInvalidConfigThrowConfigError) {
  EpConfig no_alignment;
  no_alignment.expert_alignment = 0;
  EXPECT_THROW(no_alignment.max_recv_rows(2), rocep::ConfigError);
  EpConfig negative_top_k;
  negative_top_k.top_k = -1;
  EXPECT_THROW(negative_top_k.max_recv_rows(2), rocep::ConfigError);
  EpConfig negative_tokens;
  negative_tokens.max_tokens_per_rank = -5;
  EXPECT_THROW(negative_tokens.max_recv_tokens(2), rocep::ConfigError);
  EpConfig uneven;
  uneven.num_experts = 10;
  EXPECT_THROW(uneven.num_local_experts(4), rocep::ConfigError);
}

TEST(EpConfigTest, MaxRecvRowsIsWorldTimesTokensTimesTopKPlusPadding) {
  EpConfig config;  // T 128, top_k 8, 256 experts
  EXPECT_EQ(config.max_recv_rows(2), std::size_t{2 * 128 * 8});
  config.expert_alignment = 4;  // 128 local experts, each padded by at most 3 rows
  EXPECT_EQ(config.max_recv_rows(2), std::size_t{2 * 128 * 8 + 128 * 3});
}

// The SM budget: the default share (3/16 of the multiprocessors, rounded down), every multiprocessor, or N,
// each within the rank's share of a GPU that ranks_on_gpu ranks share.
TEST(SmBudgetTest, DefaultAllAndExplicitBudgetsResolveWithinTheRanksShare) {
  const rocep::CommPolicy policy;
  EXPECT_EQ(rocep::sm_budget(EpConfig::kDefaultSms, 132, 1, policy), 24);  // H100, H200
  EXPECT_EQ(rocep::sm_budget(EpConfig::kDefaultSms, 304, 1, policy), 57);  // MI300X
  EXPECT_EQ(rocep::sm_budget(EpConfig::kDefaultSms, 132, 2, policy), 12);  // the GPU's share, split by MPS
  EXPECT_EQ(rocep::sm_budget(EpConfig::kDefaultSms, 4, 1, policy), 1);     // at least one
  EXPECT_EQ(rocep::sm_budget(EpConfig::kAllSms, 132, 1, policy), 132);
  EXPECT_EQ(rocep::sm_budget(EpConfig::kAllSms, 132, 4, policy), 33);
  EXPECT_EQ(rocep::sm_budget(8, 132, 1, policy), 8);
  EXPECT_EQ(rocep::sm_budget(66, 132, 2, policy), 66);
  EXPECT_EQ(EpConfig().num_sms, EpConfig::kDefaultSms);
  EXPECT_NE(EpConfig().describe().find("sms=default"), std::string::npos) << EpConfig().describe();
}

// A budget that shares the GPU is launched cooperatively where the platform's policy says so; kAllSms
// never is (its grid is sized by the occupancy check), nor is any budget where the policy says no.
TEST(SmBudgetTest, OnlyBudgetsThatShareTheGpuLaunchCooperatively) {
  rocep::CommPolicy policy;
  policy.cooperative_launch = true;
  EXPECT_TRUE(policy.launch_cooperatively(EpConfig::kDefaultSms));
  EXPECT_TRUE(policy.launch_cooperatively(24));
  EXPECT_FALSE(policy.launch_cooperatively(EpConfig::kAllSms));
  policy.cooperative_launch = false;
  EXPECT_FALSE(policy.launch_cooperatively(EpConfig::kDefaultSms));
  EXPECT_FALSE(policy.launch_cooperatively(24));
}

TEST(SmBudgetTest, BudgetAboveTheRanksShareThrowsConfigErrorNamingNumSmsAndTheLimit) {
  const rocep::CommPolicy policy;
  struct Refused {
    int num_sms;
    int multiprocessors;
    int ranks_on_gpu;
    const char* expected;  // in the message
  };
  for (const Refused& refused :
       {Refused{133, 132, 1, "allowed range is [1, 132]"}, Refused{67, 132, 2, "allowed range is [1, 66]"},
        Refused{EpConfig::kAllSms, 2, 4, "less than one multiprocessor per rank"}}) {
    try {
      rocep::sm_budget(refused.num_sms, refused.multiprocessors, refused.ranks_on_gpu, policy);
      ADD_FAILURE() << "num_sms " << refused.num_sms << " accepted on " << refused.multiprocessors
                    << " multiprocessors shared by " << refused.ranks_on_gpu;
    } catch (const rocep::ConfigError& error) {
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, "EpConfig.num_sms = " + std::to_string(refused.num_sms),
                          error.what());
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, refused.expected, error.what());
    }
  }
}

TEST(EpConfigTest, MaxRecvRowsCapsTopKAtLocalExperts) {
  EpConfig config;
  config.num_experts = 16;  // 2 local experts at world 8: a token yields at most 2 rows on one rank
  EXPECT_EQ(config.max_recv_rows(8), std::size_t{8 * 128 * 2});
  config.expert_alignment = 8;
  EXPECT_EQ(config.max_recv_rows(8), std::size_t{8 * 128 * 2 + 2 * 7});
}

// The combine region of a group whose combines pull (Shape::pulled_combine): after the rows and the chunk
// flags of every per-token group, the pulled rows ([world][T] int32) and then the combine input buffer
// ([world][T] rows, 16-byte aligned like every row), each past the part before it; without pulls the region
// ends at the chunk flags, as it did before.
TEST(CombineRegionTest, PulledRowsAndInputRowsFollowTheChunkFlagsAligned) {
  using rocep::device::CombineRegion;
  for (const int world : {2, 3, 8, 64}) {
    for (const int tokens : {1, 5, 1024, 4096}) {
      for (const int hidden : {128, 2048, 7168}) {
        SCOPED_TRACE("world " + std::to_string(world) + ", T " + std::to_string(tokens) + ", hidden " +
                     std::to_string(hidden));
        rocep::device::Shape shape{};
        shape.world = world;
        shape.max_tokens = tokens;
        shape.hidden = hidden;
        shape.top_k = 8;
        shape.per_token = 1;
        shape.combine_chunk_tokens = rocep::device::kMaxCombineChunkTokens;
        const std::size_t flags_end =
            CombineRegion::chunk_flag_offset(shape, rocep::device::max_combine_chunks(shape), 0);
        EXPECT_EQ(CombineRegion::bytes(shape), flags_end);
        shape.pulled_combine = 1;
        EXPECT_EQ(CombineRegion::pulled_rows_offset(shape), flags_end);
        const std::size_t rows_end = CombineRegion::pulled_row_offset(shape, world - 1, tokens - 1) + 4;
        EXPECT_LE(rows_end, CombineRegion::input_rows_offset(shape));
        EXPECT_EQ(CombineRegion::input_rows_offset(shape) % 16, 0u);
        EXPECT_EQ(CombineRegion::bytes(shape),
                  CombineRegion::input_rows_offset(shape) +
                      static_cast<std::size_t>(world) * tokens * CombineRegion::row_bytes(shape));
      }
    }
  }
}

// A bf16 group's Shape as the GPU backend derives it, for the regions' layouts and sizes.
rocep::device::Shape bf16_shape(int world, int tokens, int hidden, int top_k, int experts, bool per_token) {
  rocep::device::Shape shape{};
  shape.world = world;
  shape.max_tokens = tokens;
  shape.hidden = hidden;
  shape.top_k = top_k;
  shape.num_experts = experts;
  shape.local_experts = experts / world;
  shape.payload_bytes = static_cast<uint32_t>(hidden) * 2;
  shape.message_bytes = shape.payload_bytes;
  shape.per_token = per_token ? 1 : 0;
  shape.split_combine = 1;
  shape.combine_chunk_tokens = rocep::device::kMaxCombineChunkTokens;
  return shape;
}

// A dispatch region keeps what source s stores there (ids, weights, masks, token masks of every token and
// chunk) inside [source_offset(s), source_offset(s + 1)), the masks 8-byte aligned, and the messages after
// every source's block, 16-byte aligned: a rank on another node stages its stores into a peer's region in
// an outbox of one block (host/shmem_regions.hpp), addressed as the region from its own block on.
TEST(DispatchRegionTest, EachSourcesIdsWeightsAndMasksLieInItsOwnBlock) {
  using rocep::device::DispatchRegion;
  for (const int world : {1, 2, 3, 8, 64}) {
    for (const int tokens : {1, 63, 64, 65, 4096}) {
      for (const int top_k : {1, 6, 8}) {
        SCOPED_TRACE("world " + std::to_string(world) + ", T " + std::to_string(tokens) + ", top_k " +
                     std::to_string(top_k));
        const rocep::device::Shape shape = bf16_shape(world, tokens, 7168, top_k, 5 * world, true);
        const int chunks = rocep::device::chunks_per_source(shape);
        for (int source = 0; source < world; ++source) {
          const std::size_t begin = DispatchRegion::source_offset(shape, source);
          const std::size_t end = DispatchRegion::source_offset(shape, source + 1);
          EXPECT_EQ(end - begin, DispatchRegion::source_bytes(shape));
          EXPECT_EQ(DispatchRegion::ids_offset(shape, source, 0), begin);
          EXPECT_EQ(DispatchRegion::weights_offset(shape, source, 0),
                    DispatchRegion::ids_offset(shape, source, tokens));
          EXPECT_EQ(DispatchRegion::masks_offset(shape, source, 0),
                    DispatchRegion::weights_offset(shape, source, tokens));
          EXPECT_EQ(DispatchRegion::masks_offset(shape, source, 0) % 8, 0u);
          EXPECT_EQ(DispatchRegion::token_masks_offset(shape, source, 0),
                    DispatchRegion::masks_offset(shape, source, chunks));
          EXPECT_EQ(DispatchRegion::token_masks_offset(shape, source, chunks), end);
        }
        EXPECT_GE(DispatchRegion::message_offset(shape, 0), DispatchRegion::source_offset(shape, world));
        EXPECT_EQ(DispatchRegion::message_offset(shape, 0) % 16, 0u);
        EXPECT_EQ(DispatchRegion::bytes(shape), DispatchRegion::message_offset(shape, tokens));
      }
    }
  }
}

// Across nodes every PE holds, per-token: its dispatch messages and an image of every rank's, the combine
// region and the staging rows (world x T rows each): (3 x world + 1) x T rows of bf16, with the ids,
// weights and masks twice (the region's and one block per peer's outbox) and the chunk flags on top, under
// 1% at hidden 7168, and nothing that grows with world squared times T. The experts add only their masks.
// Expanded: the combine region of max(world, top_k) x T rows and a combine outbox of top_k x T rows per
// peer instead.
TEST(ShmemRegionSizesTest, GrowAsWorldTimesTokensAndNotWithTheExperts) {
  constexpr int kTokens = 4096;
  constexpr int kHidden = 7168;
  constexpr int kTopK = 8;
  const std::size_t row = std::size_t{kHidden} * 2;
  for (const int world : {2, 8, 16, 64}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const auto ranks = static_cast<std::size_t>(world);
    const rocep::device::Shape per_token = bf16_shape(world, kTokens, kHidden, kTopK, 256, true);
    const std::size_t rows = (3 * ranks + 1) * kTokens * row;
    const std::size_t per_token_total = rocep::ShmemRegionSizes::of(per_token).total(world);
    EXPECT_GE(per_token_total, rows);
    EXPECT_LE(per_token_total, rows + rows / 100);

    const rocep::device::Shape more_experts = bf16_shape(world, kTokens, kHidden, kTopK, 1024, true);
    const std::size_t more_experts_total = rocep::ShmemRegionSizes::of(more_experts).total(world);
    EXPECT_GT(more_experts_total, per_token_total);
    EXPECT_LE(more_experts_total, per_token_total + per_token_total / 200);

    const rocep::device::Shape expanded = bf16_shape(world, kTokens, kHidden, kTopK, 256, false);
    const std::size_t expanded_rows =
        (ranks + 1 + static_cast<std::size_t>(std::max(world, kTopK)) + ranks * kTopK) * kTokens * row;
    const std::size_t expanded_total = rocep::ShmemRegionSizes::of(expanded).total(world);
    EXPECT_GE(expanded_total, expanded_rows);
    EXPECT_LE(expanded_total, expanded_rows + expanded_rows / 100);
  }
}

// What build_info says of every build: a version of three numbers, and each field one of its documented
// values; in a build without a GPU platform (ROCEP_TEST_NO_GPU_PLATFORM) no architectures, no SHMEM engine
// and no profiler ranges, else architectures listed.
TEST(BuildInfoTest, EveryFieldHoldsOneOfItsDocumentedValues) {
  const rocep::BuildInfo info = rocep::build_info();
  int major = -1;
  int minor = -1;
  int patch = -1;
  char past = 0;
  EXPECT_EQ(std::sscanf(info.version, "%d.%d.%d%c", &major, &minor, &patch, &past), 3) << info.version;
  EXPECT_TRUE(major >= 0 && minor >= 0 && patch >= 0) << info.version;
  const auto one_of = [](const std::string& value, std::initializer_list<const char*> allowed) {
    return std::any_of(allowed.begin(), allowed.end(), [&](const char* name) { return value == name; });
  };
  EXPECT_TRUE(one_of(info.shmem_engine, {"nvshmem", "rocshmem", "none"})) << info.shmem_engine;
  EXPECT_TRUE(one_of(info.profiler_ranges, {"nvtx", "roctx", "none"})) << info.profiler_ranges;
#if defined(ROCEP_TEST_NO_GPU_PLATFORM)
  EXPECT_STREQ(info.gpu_platform, "none");
  EXPECT_STREQ(info.gpu_architectures, "");
  EXPECT_STREQ(info.shmem_engine, "none");
  EXPECT_STREQ(info.profiler_ranges, "none");
#else
  EXPECT_TRUE(one_of(info.gpu_platform, {"amd", "nvidia"})) << info.gpu_platform;
  EXPECT_STRNE(info.gpu_architectures, "");
#endif
}

}  // namespace
