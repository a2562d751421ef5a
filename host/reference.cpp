#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "codecs.hpp"
#include "hip/bf16.hpp"
#include "hip/scale_layout.hpp"
#include "rocep/errors.hpp"

namespace rocep::reference {

namespace {

using ByteVector = std::vector<uint8_t>;

template <typename T>
void append(ByteVector& bytes, const T* values, std::size_t count) {
  const auto* first = reinterpret_cast<const uint8_t*>(values);
  bytes.insert(bytes.end(), first, first + count * sizeof(T));
}

// Reads consecutive fields from a received message.
class MessageReader {
 public:
  explicit MessageReader(const ByteVector& bytes) : bytes_(bytes) {}
  bool done() const { return offset_ >= bytes_.size(); }
  template <typename T>
  void read(T* values, std::size_t count) {
    std::memcpy(values, take(count * sizeof(T)), count * sizeof(T));
  }
  template <typename T>
  T read_one() {
    T value;
    read(&value, 1);
    return value;
  }
  const uint8_t* skip(std::size_t bytes) { return take(bytes); }

 private:
  // The next `bytes` of the message; a message shorter than its reader expects is a broken protocol.
  const uint8_t* take(std::size_t bytes) {
    if (bytes > bytes_.size() - offset_) {
      throw Error("reference: a received message is shorter than expected (protocol mismatch between ranks)");
    }
    const uint8_t* first = bytes_.data() + offset_;
    offset_ += bytes;
    return first;
  }

  const ByteVector& bytes_;
  std::size_t offset_ = 0;
};

// Sends messages[r] to rank r and returns what every rank sent to this one.
std::vector<ByteVector> exchange(MPI_Comm comm, const std::vector<ByteVector>& messages) {
  const int world = static_cast<int>(messages.size());
  std::vector<int> send_counts(world), send_offsets(world), receive_counts(world), receive_offsets(world);
  ByteVector sent;
  for (int rank = 0; rank < world; ++rank) {
    if (messages[rank].size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) - sent.size()) {
      throw InvalidInputError("reference exchange: more than 2 GiB for one rank");
    }
    send_offsets[rank] = static_cast<int>(sent.size());
    send_counts[rank] = static_cast<int>(messages[rank].size());
    sent.insert(sent.end(), messages[rank].begin(), messages[rank].end());
  }
  check_mpi(MPI_Alltoall(send_counts.data(), 1, MPI_INT, receive_counts.data(), 1, MPI_INT, comm),
            "MPI_Alltoall (message sizes)");
  std::size_t total = 0;
  for (int rank = 0; rank < world; ++rank) {
    receive_offsets[rank] = static_cast<int>(total);
    total += receive_counts[rank];
  }
  ByteVector received(total);
  check_mpi(MPI_Alltoallv(sent.data(), send_counts.data(), send_offsets.data(), MPI_BYTE, received.data(),
                          receive_counts.data(), receive_offsets.data(), MPI_BYTE, comm),
            "MPI_Alltoallv");
  std::vector<ByteVector> result(world);
  for (int rank = 0; rank < world; ++rank) {
    result[rank].assign(received.begin() + receive_offsets[rank],
                        received.begin() + receive_offsets[rank] + receive_counts[rank]);
  }
  return result;
}

// A row of `hidden` bf16 values as float32, accumulated by fused multiply-add.
void fma_row(float weight, const bf16_bits* row, int hidden, float* accumulator) {
  for (int i = 0; i < hidden; ++i) {
    accumulator[i] = std::fma(weight, bf16_to_float(row[i]), accumulator[i]);
  }
}

}  // namespace

void agree_on_input_errors(MPI_Comm comm, const std::string& local_error, const char* operation) {
  int rank = 0;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  // The lowest failing rank, or INT_MAX if none failed.
  const int mine = local_error.empty() ? std::numeric_limits<int>::max() : rank;
  int first_failing = 0;
  check_mpi(MPI_Allreduce(&mine, &first_failing, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (!local_error.empty()) {
    throw InvalidInputError(local_error);
  }
  if (first_failing != std::numeric_limits<int>::max()) {
    throw InvalidInputError(std::string(operation) + ": rank " + std::to_string(first_failing) +
                            " passed invalid input; no data was exchanged");
  }
}

std::string dispatch_format_input_error(const EpConfig& config, int rank, const DispatchInputs& inputs) {
  const std::string where = "dispatch: rank " + std::to_string(rank);
  if (config.dispatch_format == TokenFormat::kBf16 && inputs.token_scales != nullptr) {
    return where + " passed token_scales, but dispatch_format bf16 has no scales";
  }
  if (config.dispatch_format == TokenFormat::kNvfp4 && inputs.token_scales == nullptr &&
      inputs.global_scale == nullptr) {
    return where + " passed a null global_scale: nvfp4 tokens quantised in dispatch need one";
  }
  return {};
}

std::string dispatch_format_output_error(const EpConfig& config, int rank, const DispatchOutputs& outputs) {
  if (config.dispatch_format != TokenFormat::kBf16 && outputs.recv_scales == nullptr) {
    return "dispatch_recv: rank " + std::to_string(rank) +
           " passed a null recv_scales, but dispatch_format " + to_string(config.dispatch_format) +
           " has scales";
  }
  return {};
}

std::string input_buffer_format_error(const EpConfig& config) {
  if (config.dispatch_format == TokenFormat::kBf16) {
    return {};
  }
  return std::string("EpGroup::dispatch_input_buffer: dispatch_format is ") +
         to_string(config.dispatch_format) + "; the input buffer holds bf16 tokens only";
}

std::string misplaced_tokens_error(int rank, const void* tokens, const void* memory, std::size_t bytes,
                                   const void* buffer) {
  const auto address = reinterpret_cast<std::uintptr_t>(tokens);
  const auto first = reinterpret_cast<std::uintptr_t>(memory);
  if (tokens == buffer || address < first || address - first >= bytes) {
    return {};
  }
  return "dispatch: rank " + std::to_string(rank) +
         " passed tokens inside the group's own dispatch memory but not at dispatch_input_buffer()";
}

ReferenceEp::ReferenceEp(MPI_Comm comm, const EpConfig& config) : bootstrap_(comm), config_(config) {
  config_.validate(bootstrap_.size());
  config_.fp8_encoding = reference_fp8_encoding(config_.fp8_encoding);
  local_experts_ = config_.num_local_experts(bootstrap_.size());
}

void* ReferenceEp::dispatch_input_buffer() {
  const std::string error = input_buffer_format_error(config_);
  if (!error.empty()) {
    throw ConfigError(error);
  }
  input_buffer_.resize(static_cast<std::size_t>(config_.max_tokens_per_rank) * config_.hidden);
  return input_buffer_.data();
}

void ReferenceEp::dispatch_send(const DispatchInputs& inputs) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int num_tokens =
      inputs.num_tokens_on_device != nullptr ? *inputs.num_tokens_on_device : inputs.num_tokens;

  // Validate everything before anything moves; every rank learns whether any rank failed.
  std::string error;
  if (dispatch_sent_) {
    error = "dispatch_send called twice without dispatch_recv";
  } else if (num_tokens < 0 || num_tokens > config_.max_tokens_per_rank) {
    error = "dispatch: rank " + std::to_string(rank()) +
            " passed num_tokens = " + std::to_string(num_tokens) + ", allowed range is [0, " +
            std::to_string(config_.max_tokens_per_rank) + "]";
  } else if (num_tokens > 0 &&
             (inputs.tokens == nullptr || inputs.topk_ids == nullptr || inputs.topk_weights == nullptr)) {
    error =
        "dispatch: rank " + std::to_string(rank()) + " passed a null tokens/topk_ids/topk_weights pointer";
  } else {
    error = misplaced_tokens_error(rank(), inputs.tokens, input_buffer_.data(),
                                   input_buffer_.size() * sizeof(bf16_bits), input_buffer_.data());
    if (error.empty()) {
      error = dispatch_format_input_error(config_, rank(), inputs);
    }
  }
  for (int token = 0; error.empty() && token < num_tokens; ++token) {
    const int32_t* ids = inputs.topk_ids + static_cast<std::size_t>(token) * top_k;
    for (int k = 0; error.empty() && k < top_k; ++k) {
      const std::string where = "dispatch: rank " + std::to_string(rank()) + " token " +
                                std::to_string(token) + " slot " + std::to_string(k);
      if (ids[k] < -1 || ids[k] >= config_.num_experts) {
        error = where + ": expert id " + std::to_string(ids[k]) + " is outside [-1, " +
                std::to_string(config_.num_experts) + ")";
      } else if (ids[k] >= 0 && std::find(ids, ids + k, ids[k]) != ids + k) {
        error = where + ": expert id " + std::to_string(ids[k]) + " is named twice by this token";
      }
    }
  }
  agree_on_input_errors(bootstrap_.comm(), error, "dispatch");

  // One message per (token, destination rank) that owns any of its experts: the token index, the ids that
  // concern that rank (-1 elsewhere), all weights, then the payload and the scales.
  const TokenFormat format = config_.dispatch_format;
  const int hidden = config_.hidden;
  const std::size_t payload_bytes = format_payload_bytes(format, hidden);
  const std::size_t scale_bytes = format_scale_bytes(format, hidden);
  const bool quantize = format != TokenFormat::kBf16 && inputs.token_scales == nullptr;
  const float global_scale = quantize && format == TokenFormat::kNvfp4 ? *inputs.global_scale : 1.0f;
  std::vector<ByteVector> messages(world);
  std::vector<int32_t> ids_for_rank(top_k);
  ByteVector body(payload_bytes + scale_bytes);
  std::vector<float> values(hidden);
  for (int token = 0; token < num_tokens; ++token) {
    if (quantize) {
      const auto* row =
          static_cast<const bf16_bits*>(inputs.tokens) + static_cast<std::size_t>(token) * hidden;
      std::transform(row, row + hidden, values.begin(), bf16_to_float);
      quantize_row(format, config_.fp8_encoding, values.data(), hidden, global_scale, body.data(),
                   body.data() + payload_bytes);
    } else {
      std::memcpy(body.data(), static_cast<const uint8_t*>(inputs.tokens) + token * payload_bytes,
                  payload_bytes);
      if (scale_bytes > 0) {
        std::memcpy(body.data() + payload_bytes,
                    static_cast<const uint8_t*>(inputs.token_scales) + token * scale_bytes, scale_bytes);
      }
    }
    const int32_t* ids = inputs.topk_ids + static_cast<std::size_t>(token) * top_k;
    for (int destination = 0; destination < world; ++destination) {
      bool any = false;
      for (int k = 0; k < top_k; ++k) {
        const bool here = ids[k] >= 0 && ids[k] / local_experts_ == destination;
        ids_for_rank[k] = here ? ids[k] : -1;
        any = any || here;
      }
      if (!any) {
        continue;
      }
      ByteVector& message = messages[destination];
      append(message, &token, 1);
      append(message, ids_for_rank.data(), top_k);
      append(message, inputs.topk_weights + static_cast<std::size_t>(token) * top_k, top_k);
      append(message, body.data(), body.size());
    }
  }
  dispatched_ = false;  // until dispatch_recv lays this dispatch out, there is nothing to combine
  sent_tokens_ = num_tokens;
  sent_topk_ids_.assign(inputs.topk_ids, inputs.topk_ids + static_cast<std::size_t>(num_tokens) * top_k);
  received_messages_ = exchange(bootstrap_.comm(), messages);
  dispatch_sent_ = true;
}

void ReferenceEp::dispatch_recv(const DispatchOutputs& outputs) {
  const int world = world_size();
  const int top_k = config_.top_k;
  std::string error;
  // A failed dispatch_recv still ends the dispatch in flight, so the group stays usable.
  const bool was_sent = dispatch_sent_;
  dispatch_sent_ = false;
  if (!was_sent) {
    error = "dispatch_recv called without dispatch_send";
  } else if (outputs.recv_tokens == nullptr || outputs.row_offsets == nullptr ||
             outputs.expert_ids == nullptr || outputs.src_info == nullptr ||
             outputs.recv_weights == nullptr) {
    error = "dispatch_recv: rank " + std::to_string(rank()) + " passed a null output pointer";
  } else {
    error = dispatch_format_output_error(config_, rank(), outputs);
  }
  agree_on_input_errors(bootstrap_.comm(), error, "dispatch_recv");

  // Decode the messages: per source rank, in the order sent (ascending token).
  struct Arrival {
    int32_t token;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    const uint8_t* payload;
  };
  const TokenFormat format = config_.dispatch_format;
  const int hidden = config_.hidden;
  const std::size_t payload_bytes = format_payload_bytes(format, hidden);
  const std::size_t scale_bytes = format_scale_bytes(format, hidden);
  std::vector<std::vector<Arrival>> arrivals(world);
  for (int source = 0; source < world; ++source) {
    MessageReader reader(received_messages_[source]);
    while (!reader.done()) {
      Arrival arrival{reader.read_one<int32_t>(), std::vector<int32_t>(top_k), std::vector<float>(top_k),
                      nullptr};
      reader.read(arrival.ids.data(), top_k);
      reader.read(arrival.weights.data(), top_k);
      arrival.payload = reader.skip(payload_bytes + scale_bytes);
      arrivals[source].push_back(std::move(arrival));
    }
  }

  received_tokens_.assign(world, {});
  for (int source = 0; source < world; ++source) {
    for (const Arrival& arrival : arrivals[source]) {
      received_tokens_[source].push_back({arrival.token, std::vector<int32_t>(top_k, -1)});
    }
  }

  // Rows expert by expert; inside an expert by source rank, source token, then k; each expert's segment
  // padded to a multiple of expert_alignment with zero rows.
  auto* recv_tokens = static_cast<uint8_t*>(outputs.recv_tokens);
  // Row `row`'s scales from `scales` (row-major, as they travel), or zeros when null.
  const auto device_format = static_cast<device::Format>(format);
  const int blocks = hidden / format_block_elements(format);
  const std::size_t scale_size = format == TokenFormat::kBf16 ? 0 : scale_bytes / blocks;
  const std::size_t scale_rows = config_.max_recv_rows(world);
  auto store_scales = [&](std::size_t row, const uint8_t* scales) {
    for (int block = 0; scale_size > 0 && block < blocks; ++block) {
      uint8_t* destination = static_cast<uint8_t*>(outputs.recv_scales) +
                             device::scale_offset(device_format, row, block, scale_rows, hidden);
      if (scales != nullptr) {
        std::memcpy(destination, scales + block * scale_size, scale_size);
      } else {
        std::memset(destination, 0, scale_size);
      }
    }
  };
  uint32_t row = 0;
  for (int expert = 0; expert < local_experts_; ++expert) {
    const int32_t global_expert = rank() * local_experts_ + expert;
    outputs.row_offsets[expert] = row;
    outputs.expert_ids[expert] = expert;
    const uint32_t first_row = row;
    for (int source = 0; source < world; ++source) {
      for (std::size_t index = 0; index < arrivals[source].size(); ++index) {
        const Arrival& arrival = arrivals[source][index];
        for (int k = 0; k < top_k; ++k) {
          if (arrival.ids[k] != global_expert) {
            continue;
          }
          std::memcpy(recv_tokens + row * payload_bytes, arrival.payload, payload_bytes);
          store_scales(row, arrival.payload + payload_bytes);
          outputs.src_info[row] = {source, arrival.token, k};
          outputs.recv_weights[row] = arrival.weights[k];
          received_tokens_[source][index].rows[k] = static_cast<int32_t>(row);
          ++row;
        }
      }
    }
    if (outputs.expert_token_counts != nullptr) {
      outputs.expert_token_counts[expert] += row - first_row;
    }
    while ((row - first_row) % config_.expert_alignment != 0) {
      std::memset(recv_tokens + row * payload_bytes, 0, payload_bytes);
      store_scales(row, nullptr);
      outputs.src_info[row] = {-1, -1, -1};
      outputs.recv_weights[row] = 0.0f;
      ++row;
    }
  }
  outputs.row_offsets[local_experts_] = row;
  received_messages_.clear();
  dispatched_ = true;
}

void ReferenceEp::combine_send(const CombineArgs& args) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int hidden = config_.hidden;
  std::string error;
  if (!dispatched_) {
    error = "combine_send called without a dispatch before it";
  } else if (combine_sent_) {
    error = "combine_send called twice without combine_recv";
  } else if (args.expert_outputs == nullptr || args.out == nullptr) {
    error = "combine: rank " + std::to_string(rank()) + " passed a null expert_outputs/out pointer";
  }
  // Weighted and unweighted combines lay their messages out differently: every rank must do the same.
  const int weighted = args.row_weights != nullptr ? 1 : 0;
  int weighted_ranks = 0;
  check_mpi(MPI_Allreduce(&weighted, &weighted_ranks, 1, MPI_INT, MPI_SUM, bootstrap_.comm()),
            "MPI_Allreduce");
  if (error.empty() && weighted_ranks != 0 && weighted_ranks != world) {
    error = "combine: rank " + std::to_string(rank()) + " passed row_weights " + (weighted ? "set" : "null") +
            " but " + std::to_string(weighted ? world - weighted_ranks : weighted_ranks) +
            " other rank(s) did not: weighted or not must agree on every rank";
  }
  agree_on_input_errors(bootstrap_.comm(), error, "combine");

  // Weighted: one partial row per received token, reduced here in ascending k. Unweighted: one row per
  // (token, k), prefixed by k.
  const auto* expert_outputs = static_cast<const bf16_bits*>(args.expert_outputs);
  std::vector<ByteVector> messages(world);
  std::vector<float> accumulator(hidden);
  std::vector<bf16_bits> partial(hidden);
  for (int source = 0; source < world; ++source) {
    for (const ReceivedToken& received : received_tokens_[source]) {
      ByteVector& message = messages[source];
      append(message, &received.token, 1);
      if (args.row_weights != nullptr) {
        std::fill(accumulator.begin(), accumulator.end(), 0.0f);
        for (int k = 0; k < top_k; ++k) {
          const int32_t row = received.rows[k];
          if (row >= 0) {
            fma_row(args.row_weights[row], expert_outputs + static_cast<std::size_t>(row) * hidden, hidden,
                    accumulator.data());
          }
        }
        std::transform(accumulator.begin(), accumulator.end(), partial.begin(), float_to_bf16);
        append(message, partial.data(), hidden);
      } else {
        for (int k = 0; k < top_k; ++k) {
          const int32_t row = received.rows[k];
          if (row >= 0) {
            append(message, expert_outputs + static_cast<std::size_t>(row) * hidden, hidden);
          }
        }
      }
    }
  }
  combine_messages_ = exchange(bootstrap_.comm(), messages);
  combine_sent_ = true;
}

void ReferenceEp::combine_recv(const CombineArgs& args) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int hidden = config_.hidden;
  std::string error;
  if (!combine_sent_) {
    error = "combine_recv called without combine_send";
  }
  agree_on_input_errors(bootstrap_.comm(), error, "combine_recv");
  combine_sent_ = false;

  // Which ranks got each token, from the ids this rank dispatched.
  auto rank_has_token = [&](int token, int destination) {
    const int32_t* ids = sent_topk_ids_.data() + static_cast<std::size_t>(token) * top_k;
    return std::any_of(ids, ids + top_k,
                       [&](int32_t id) { return id >= 0 && id / local_experts_ == destination; });
  };
  auto* out = static_cast<bf16_bits*>(args.out);
  const auto* shared = static_cast<const bf16_bits*>(args.shared_expert_output);
  std::vector<MessageReader> readers;
  for (int source = 0; source < world; ++source) {
    readers.emplace_back(combine_messages_[source]);
  }

  if (args.row_weights != nullptr) {
    std::vector<float> accumulator(hidden);
    std::vector<bf16_bits> partial(hidden);
    for (int token = 0; token < sent_tokens_; ++token) {
      std::fill(accumulator.begin(), accumulator.end(), 0.0f);
      for (int source = 0; source < world; ++source) {
        if (!rank_has_token(token, source)) {
          continue;
        }
        readers[source].read_one<int32_t>();
        readers[source].read(partial.data(), hidden);
        for (int i = 0; i < hidden; ++i) {
          accumulator[i] += bf16_to_float(partial[i]);
        }
      }
      if (shared != nullptr) {
        for (int i = 0; i < hidden; ++i) {
          accumulator[i] += bf16_to_float(shared[static_cast<std::size_t>(token) * hidden + i]);
        }
      }
      std::transform(accumulator.begin(), accumulator.end(), out + static_cast<std::size_t>(token) * hidden,
                     float_to_bf16);
    }
  } else {
    for (int token = 0; token < sent_tokens_; ++token) {
      const int32_t* ids = sent_topk_ids_.data() + static_cast<std::size_t>(token) * top_k;
      for (int source = 0; source < world; ++source) {
        if (!rank_has_token(token, source)) {
          continue;
        }
        readers[source].read_one<int32_t>();
        for (int k = 0; k < top_k; ++k) {
          if (ids[k] >= 0 && ids[k] / local_experts_ == source) {
            readers[source].read(out + (static_cast<std::size_t>(token) * top_k + k) * hidden, hidden);
          }
        }
      }
      for (int k = 0; k < top_k; ++k) {
        if (ids[k] < 0) {
          std::fill_n(out + (static_cast<std::size_t>(token) * top_k + k) * hidden, hidden, bf16_bits{0});
        }
      }
    }
  }
  combine_messages_.clear();
}

}  // namespace rocep::reference
