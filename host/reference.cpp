#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

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

// Sends messages[r] to rank r and returns what every rank sent to this one, through two all-gathers: the
// sizes of every rank's messages, then every rank's messages back to back, padded to the largest total.
std::vector<ByteVector> exchange_messages(Bootstrap& bootstrap, const std::vector<ByteVector>& messages) {
  const int world = static_cast<int>(messages.size());
  const int rank = bootstrap.rank();
  std::vector<uint64_t> sizes(world);
  ByteVector sent;
  for (int destination = 0; destination < world; ++destination) {
    sizes[destination] = messages[destination].size();
    sent.insert(sent.end(), messages[destination].begin(), messages[destination].end());
  }
  std::vector<uint64_t> all_sizes(static_cast<std::size_t>(world) * world);  // [source][destination]
  bootstrap.all_gather(sizes.data(), all_sizes.data(), world * sizeof(uint64_t));
  uint64_t largest = 0;
  for (int source = 0; source < world; ++source) {
    uint64_t total = 0;
    for (int destination = 0; destination < world; ++destination) {
      total += all_sizes[static_cast<std::size_t>(source) * world + destination];
    }
    largest = std::max(largest, total);
  }
  sent.resize(largest);
  ByteVector received(largest * world);
  bootstrap.all_gather(sent.data(), received.data(), largest);
  std::vector<ByteVector> result(world);
  for (int source = 0; source < world; ++source) {
    const uint64_t* from_source = all_sizes.data() + static_cast<std::size_t>(source) * world;
    uint64_t offset = 0;
    for (int destination = 0; destination < rank; ++destination) {
      offset += from_source[destination];
    }
    const auto first = received.begin() + static_cast<std::ptrdiff_t>(largest * source + offset);
    result[source].assign(first, first + static_cast<std::ptrdiff_t>(from_source[rank]));
  }
  return result;
}

// Local-only mode: what this rank sent to itself, and nothing from or to the others.
std::vector<ByteVector> own_messages(std::vector<ByteVector> messages, int rank) {
  std::vector<ByteVector> kept(messages.size());
  kept[rank] = std::move(messages[rank]);
  return kept;
}

// A row of `hidden` bf16 values as float32, accumulated by fused multiply-add.
void fma_row(float weight, const bf16_bits* row, int hidden, float* accumulator) {
  for (int i = 0; i < hidden; ++i) {
    accumulator[i] = std::fma(weight, bf16_to_float(row[i]), accumulator[i]);
  }
}

// CombineArgs' epilogue on one token's combined values (include/rocep/types.hpp), in its order.
void apply_epilogue(const CombineArgs& args, int token, int hidden, float* values) {
  const auto* residual = static_cast<const bf16_bits*>(args.residual);
  for (int i = 0; i < hidden; ++i) {
    if (args.factor != 1.0f) {
      values[i] *= args.factor;
    }
    if (args.token_factors != nullptr) {
      values[i] *= args.token_factors[token];
    }
    if (residual != nullptr) {
      values[i] += bf16_to_float(residual[static_cast<std::size_t>(token) * hidden + i]);
    }
  }
}

}  // namespace

ReferenceEp::ReferenceEp(Bootstrap& bootstrap, const EpConfig& config)
    : bootstrap_(bootstrap), config_(config) {
  config_.validate(bootstrap_.size());
  config_.fp8_encoding = reference_fp8_encoding(config_.fp8_encoding);
  local_experts_ = config_.num_local_experts(bootstrap_.size());
  layout_ = node_layout(bootstrap_, config_.gpus_per_node);
  sums_nodes_ = sums_nodes(config_, layout_);
}

void ReferenceEp::sum_partials(const std::vector<std::vector<float>>& rows, const std::vector<char>& has_row,
                               std::vector<float>& sum) const {
  const int world = world_size();
  const std::size_t hidden = sum.size();
  std::vector<float> node_sum(hidden);
  for (int source = 0; source < world; ++source) {
    if (!sums_nodes_ || layout_.on_this_node(source)) {
      if (has_row[source] != 0) {
        for (std::size_t i = 0; i < hidden; ++i) {
          sum[i] += rows[source][i];
        }
      }
      continue;
    }
    const int node = layout_.node_of_rank[source];
    if (message_holder(layout_, rank(), node) != source) {
      continue;  // summed into the node sum of the rank there that holds this rank's messages
    }
    std::fill(node_sum.begin(), node_sum.end(), 0.0f);
    bool any = false;
    for (int mate = 0; mate < world; ++mate) {
      if (layout_.node_of_rank[mate] == node && has_row[mate] != 0) {
        any = true;
        for (std::size_t i = 0; i < hidden; ++i) {
          node_sum[i] += rows[mate][i];
        }
      }
    }
    if (any) {
      for (std::size_t i = 0; i < hidden; ++i) {
        sum[i] += bf16_to_float(float_to_bf16(node_sum[i]));
      }
    }
  }
}

void ReferenceEp::record(device::StatusCode code, device::Operation operation, int peer, int token, int slot,
                         int value) {
  const std::lock_guard<std::mutex> lock(status_lock_);
  if (status_.code == static_cast<uint32_t>(device::StatusCode::kOk)) {
    status_ = {static_cast<uint32_t>(code), static_cast<int32_t>(operation), peer, token, slot, value};
  }
}

void* ReferenceEp::dispatch_input_buffer() {
  input_buffer_.resize(static_cast<std::size_t>(config_.max_tokens_per_rank) *
                       format_input_row_bytes(config_.dispatch_format, config_.hidden));
  return input_buffer_.data();
}

contract::OwnMemory ReferenceEp::dispatch_memory() const {
  return {input_buffer_.data(), input_buffer_.size(), input_buffer_.data()};
}

void* ReferenceEp::combine_input_buffer() {
  combine_input_buffer_.resize(static_cast<std::size_t>(world_size()) * config_.max_tokens_per_rank *
                               config_.hidden);
  return combine_input_buffer_.data();
}

contract::OwnMemory ReferenceEp::combine_memory() const {
  return {combine_input_buffer_.data(), combine_input_buffer_.size() * sizeof(bf16_bits),
          combine_input_buffer_.data()};
}

RecordedError ReferenceEp::poll_error() {
  const std::lock_guard<std::mutex> lock(status_lock_);
  return contract::recorded_error(status_, config_, rank());
}

RecordedError ReferenceEp::synchronize(void* /*stream*/) {
  const std::lock_guard<std::mutex> lock(status_lock_);
  const RecordedError error = contract::recorded_error(status_, config_, rank());
  status_ = {};
  return error;
}

void ReferenceEp::dispatch_send(const DispatchInputs& inputs, void* /*stream*/) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int num_tokens =
      inputs.num_tokens_on_device != nullptr ? *inputs.num_tokens_on_device : inputs.num_tokens;
  if (num_tokens < 0 || num_tokens > config_.max_tokens_per_rank) {
    // A count only known while the call runs: no token is sent, the peers complete.
    record(device::StatusCode::kTokenCountOutOfRange, device::Operation::kDispatchSend, -1, -1, -1,
           num_tokens);
    dispatch_send(contract::zero_tokens(), nullptr);
    return;
  }
  // The ids as dispatched: an id out of range, or named a second time by its token, becomes -1.
  std::vector<int32_t> checked_ids(inputs.topk_ids,
                                   inputs.topk_ids + static_cast<std::size_t>(num_tokens) * top_k);
  for (int token = 0; token < num_tokens; ++token) {
    int32_t* ids = checked_ids.data() + static_cast<std::size_t>(token) * top_k;
    const int32_t* given = inputs.topk_ids + static_cast<std::size_t>(token) * top_k;
    for (int k = 0; k < top_k; ++k) {
      if (given[k] < -1 || given[k] >= config_.num_experts) {
        record(device::StatusCode::kExpertOutOfRange, device::Operation::kDispatchSend, -1, token, k,
               given[k]);
        ids[k] = -1;
      } else if (given[k] >= 0 && std::find(given, given + k, given[k]) != given + k) {
        record(device::StatusCode::kExpertRepeated, device::Operation::kDispatchSend, -1, token, k, given[k]);
        ids[k] = -1;
      }
    }
  }

  // One message per (token, destination rank) that owns any of its experts: the token index, the ids that
  // concern that rank (-1 elsewhere), all weights, then the payload and the scales.
  const TokenFormat format = config_.dispatch_format;
  const int hidden = config_.hidden;
  const std::size_t payload_bytes = format_payload_bytes(format, hidden);
  const std::size_t scale_bytes = format_scale_bytes(format, hidden);
  // Tokens in the input buffer: each row the payload, then the scales (format_input_row_bytes apart).
  const bool in_buffer = inputs.tokens != nullptr && inputs.tokens == input_buffer_.data();
  const std::size_t row_bytes = in_buffer ? format_input_row_bytes(format, hidden) : payload_bytes;
  const bool quantize = format != TokenFormat::kBf16 && inputs.token_scales == nullptr && !in_buffer;
  const float global_scale =
      quantize && num_tokens > 0 && format == TokenFormat::kNvfp4 ? *inputs.global_scale : 1.0f;
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
      const uint8_t* row = static_cast<const uint8_t*>(inputs.tokens) + token * row_bytes;
      std::memcpy(body.data(), row, payload_bytes);
      if (scale_bytes > 0) {
        std::memcpy(body.data() + payload_bytes,
                    in_buffer ? row + payload_bytes
                              : static_cast<const uint8_t*>(inputs.token_scales) + token * scale_bytes,
                    scale_bytes);
      }
    }
    const int32_t* ids = checked_ids.data() + static_cast<std::size_t>(token) * top_k;
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
  sent_tokens_ = num_tokens;
  sent_topk_ids_ = std::move(checked_ids);
  received_messages_ = config_.local_only ? own_messages(std::move(messages), rank())
                                          : exchange_messages(bootstrap_, messages);
}

std::vector<std::vector<ReferenceEp::Arrival>> ReferenceEp::decode_arrivals() const {
  const int top_k = config_.top_k;
  const std::size_t message_bytes = format_payload_bytes(config_.dispatch_format, config_.hidden) +
                                    format_scale_bytes(config_.dispatch_format, config_.hidden);
  std::vector<std::vector<Arrival>> arrivals(world_size());
  for (int source = 0; source < world_size(); ++source) {
    MessageReader reader(received_messages_[source]);
    while (!reader.done()) {
      Arrival arrival{reader.read_one<int32_t>(), std::vector<int32_t>(top_k), std::vector<float>(top_k),
                      nullptr};
      reader.read(arrival.ids.data(), top_k);
      reader.read(arrival.weights.data(), top_k);
      arrival.payload = reader.skip(message_bytes);
      arrivals[source].push_back(std::move(arrival));
    }
  }
  return arrivals;
}

void ReferenceEp::dispatch_recv(const DispatchOutputs& outputs, void* /*stream*/) {
  const std::vector<std::vector<Arrival>> arrivals = decode_arrivals();
  received_tokens_.assign(world_size(), {});
  for (int source = 0; source < world_size(); ++source) {
    for (const Arrival& arrival : arrivals[source]) {
      received_tokens_[source].push_back({arrival.token, std::vector<int32_t>(config_.top_k, -1), -1});
    }
  }
  if (config_.layout == Layout::kPerToken) {
    lay_out_per_token(arrivals, outputs);
  } else {
    lay_out_expanded(arrivals, outputs);
  }
  received_messages_.clear();
}

// A row per received token in (source, token) order; then, expert by expert, its (row, slot) pairs in row
// order as row * top_k + slot, each expert's segment padded to the alignment with world * T * top_k.
void ReferenceEp::lay_out_per_token(const std::vector<std::vector<Arrival>>& arrivals,
                                    const DispatchOutputs& outputs) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const std::size_t payload_bytes = format_payload_bytes(config_.dispatch_format, config_.hidden);
  const std::size_t scale_bytes = format_scale_bytes(config_.dispatch_format, config_.hidden);
  const int32_t first_expert = rank() * local_experts_;
  struct Pair {
    int32_t row;
    int k;
  };
  std::vector<std::vector<Pair>> expert_pairs(local_experts_);
  int32_t row = 0;
  for (int source = 0; source < world; ++source) {
    for (std::size_t index = 0; index < arrivals[source].size(); ++index) {
      const Arrival& arrival = arrivals[source][index];
      std::memcpy(static_cast<uint8_t*>(outputs.recv_tokens) + row * payload_bytes, arrival.payload,
                  payload_bytes);
      if (scale_bytes > 0) {
        std::memcpy(static_cast<uint8_t*>(outputs.recv_scales) + row * scale_bytes,
                    arrival.payload + payload_bytes, scale_bytes);
      }
      outputs.src_info[row] = {source, arrival.token, -1};
      for (int k = 0; k < top_k; ++k) {
        const int32_t id = arrival.ids[k];
        const std::size_t slot = static_cast<std::size_t>(row) * top_k + k;
        outputs.recv_topk_ids[slot] = id >= 0 ? id - first_expert : -1;
        outputs.recv_topk_weights[slot] = arrival.weights[k];
        if (id >= 0) {
          expert_pairs[id - first_expert].push_back({row, k});
        }
      }
      received_tokens_[source][index].token_row = row;
      ++row;
    }
  }
  *outputs.num_recv_tokens = row;
  const auto padding = static_cast<int32_t>(config_.max_recv_tokens(world) * top_k);
  const int alignment = config_.expert_alignment;
  uint32_t entry = 0;
  for (int expert = 0; expert < local_experts_; ++expert) {
    outputs.row_offsets[expert] = entry;
    const uint32_t first_entry = entry;
    for (const Pair& pair : expert_pairs[expert]) {
      outputs.sorted_token_ids[entry++] = pair.row * top_k + pair.k;
    }
    if (outputs.expert_token_counts != nullptr) {
      outputs.expert_token_counts[expert] += entry - first_entry;
    }
    while ((entry - first_entry) % alignment != 0) {
      outputs.sorted_token_ids[entry++] = padding;
    }
    for (uint32_t block = first_entry / alignment; block < entry / alignment; ++block) {
      outputs.block_expert_ids[block] = expert;
    }
  }
  outputs.row_offsets[local_experts_] = entry;
}

// Rows expert by expert; inside an expert by source rank, source token, then k; each expert's segment
// padded to a multiple of expert_alignment with zero rows.
void ReferenceEp::lay_out_expanded(const std::vector<std::vector<Arrival>>& arrivals,
                                   const DispatchOutputs& outputs) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const TokenFormat format = config_.dispatch_format;
  const int hidden = config_.hidden;
  const std::size_t payload_bytes = format_payload_bytes(format, hidden);
  const std::size_t scale_bytes = format_scale_bytes(format, hidden);
  auto* recv_tokens = static_cast<uint8_t*>(outputs.recv_tokens);
  // With expert input scales (bf16 only), a row is fp8 codes: one byte per element.
  const float* input_scales = outputs.expert_input_scales;
  const std::size_t row_bytes = input_scales != nullptr ? static_cast<std::size_t>(hidden) : payload_bytes;
  const Fp8Encoding encoding = config_.fp8_encoding;
  auto quantize_with_input_scale = [&](const uint8_t* payload, float scale, uint8_t* codes) {
    for (int i = 0; i < hidden; ++i) {
      bf16_bits element;
      std::memcpy(&element, payload + i * sizeof(bf16_bits), sizeof(element));
      codes[i] = encode_fp8(bf16_to_float(element) / scale, encoding);
    }
  };
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
          if (input_scales != nullptr) {
            quantize_with_input_scale(arrival.payload, input_scales[expert], recv_tokens + row * row_bytes);
          } else {
            std::memcpy(recv_tokens + row * row_bytes, arrival.payload, row_bytes);
          }
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
      std::memset(recv_tokens + row * row_bytes, 0, row_bytes);
      store_scales(row, nullptr);
      outputs.src_info[row] = {-1, -1, -1};
      outputs.recv_weights[row] = 0.0f;
      ++row;
    }
  }
  outputs.row_offsets[local_experts_] = row;
}

void ReferenceEp::combine_send(const CombineArgs& args, void* /*stream*/) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int hidden = config_.hidden;
  // Every message starts with whether this rank's combine sends partials (weighted, or the per-token
  // layout), so that the receivers can check that every rank agrees. Weighted: one partial row per received
  // token, reduced here in ascending k. Per-token: the token's row as given. Unweighted: one row per
  // (token, k).
  const auto* expert_outputs = static_cast<const bf16_bits*>(args.expert_outputs);
  const int32_t weighted = sends_partials(args) ? 1 : 0;
  std::vector<ByteVector> messages(world);
  for (ByteVector& message : messages) {
    append(message, &weighted, 1);
  }
  std::vector<float> accumulator(hidden);
  std::vector<bf16_bits> partial(hidden);
  // A partial bound for another rank in fp8 (combine_dtype), from its float32 values; else in bf16.
  ByteVector quantized(fp8_partial_bytes());
  auto append_partial = [&](ByteVector& message, int destination, const float* values) {
    if (crosses_in_fp8(destination)) {
      const std::size_t payload_bytes = format_payload_bytes(TokenFormat::kFp8Block128, hidden);
      quantize_row(TokenFormat::kFp8Block128, config_.fp8_encoding, values, hidden, 1.0f, quantized.data(),
                   quantized.data() + payload_bytes);
      append(message, quantized.data(), quantized.size());
    } else {
      std::transform(values, values + hidden, partial.begin(), float_to_bf16);
      append(message, partial.data(), hidden);
    }
  };
  for (int source = 0; source < world; ++source) {
    for (const ReceivedToken& received : received_tokens_[source]) {
      ByteVector& message = messages[source];
      append(message, &received.token, 1);
      if (config_.layout == Layout::kPerToken) {
        const bf16_bits* row = expert_outputs + static_cast<std::size_t>(received.token_row) * hidden;
        if (crosses_in_fp8(source)) {
          std::transform(row, row + hidden, accumulator.begin(), bf16_to_float);
          append_partial(message, source, accumulator.data());
        } else {
          append(message, row, hidden);  // as given
        }
      } else if (args.row_weights != nullptr) {
        std::fill(accumulator.begin(), accumulator.end(), 0.0f);
        for (int k = 0; k < top_k; ++k) {
          const int32_t row = received.rows[k];
          if (row >= 0) {
            fma_row(args.row_weights[row], expert_outputs + static_cast<std::size_t>(row) * hidden, hidden,
                    accumulator.data());
          }
        }
        append_partial(message, source, accumulator.data());
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
  combine_messages_ = config_.local_only ? own_messages(std::move(messages), rank())
                                         : exchange_messages(bootstrap_, messages);
}

bool ReferenceEp::in_shared_expert_slice(int token) const {
  if (!config_.local_only) {
    return true;
  }
  const int64_t ranks = config_.allreduce_world_size;
  const int64_t position = rank() % ranks;
  return token >= sent_tokens_ * position / ranks && token < sent_tokens_ * (position + 1) / ranks;
}

void ReferenceEp::combine_recv(const CombineArgs& args, void* /*stream*/) {
  const int world = world_size();
  const int top_k = config_.top_k;
  const int hidden = config_.hidden;
  std::vector<MessageReader> readers;
  const int32_t weighted = sends_partials(args) ? 1 : 0;
  // The ranks whose rows this rank sums: every rank, or in local-only mode this rank alone.
  auto contributes = [&](int source) { return !config_.local_only || source == rank(); };
  for (int source = 0; source < world; ++source) {
    readers.emplace_back(combine_messages_[source]);
    if (!contributes(source)) {
      continue;
    }
    const auto source_weighted = readers.back().read_one<int32_t>();
    if (source_weighted != weighted) {
      // The messages cannot be read as this rank's combine would: out is left as it was.
      record(device::StatusCode::kCombineWeightingMismatch, device::Operation::kCombineRecv, source, -1, -1,
             source_weighted);
      combine_messages_.clear();
      return;
    }
  }

  // Which ranks got each token, from the ids this rank dispatched.
  auto rank_has_token = [&](int token, int destination) {
    const int32_t* ids = sent_topk_ids_.data() + static_cast<std::size_t>(token) * top_k;
    return contributes(destination) && std::any_of(ids, ids + top_k, [&](int32_t id) {
             return id >= 0 && id / local_experts_ == destination;
           });
  };
  auto* out = static_cast<bf16_bits*>(args.out);
  const std::size_t out_stride =
      args.out_row_stride != 0 ? args.out_row_stride : static_cast<std::size_t>(hidden);
  const auto* shared = static_cast<const bf16_bits*>(args.shared_expert_output);

  if (weighted != 0) {
    std::vector<float> accumulator(hidden);
    std::vector<std::vector<float>> rows(world, std::vector<float>(hidden));  // [rank]: its row, as float32
    std::vector<char> has_row(world);
    std::vector<bf16_bits> partial(hidden);
    const std::size_t payload_bytes = format_payload_bytes(TokenFormat::kFp8Block128, hidden);
    ByteVector quantized(fp8_partial_bytes());
    for (int token = 0; token < sent_tokens_; ++token) {
      std::fill(accumulator.begin(), accumulator.end(), 0.0f);
      for (int source = 0; source < world; ++source) {
        has_row[source] = rank_has_token(token, source) ? 1 : 0;
        if (has_row[source] == 0) {
          continue;
        }
        readers[source].read_one<int32_t>();
        if (crosses_in_fp8(source)) {
          readers[source].read(quantized.data(), quantized.size());
          dequantize_row(TokenFormat::kFp8Block128, config_.fp8_encoding, quantized.data(),
                         quantized.data() + payload_bytes, hidden, 1.0f, rows[source].data());
        } else {
          readers[source].read(partial.data(), hidden);
          std::transform(partial.begin(), partial.end(), rows[source].begin(), bf16_to_float);
        }
      }
      sum_partials(rows, has_row, accumulator);
      if (shared != nullptr && in_shared_expert_slice(token)) {
        for (int i = 0; i < hidden; ++i) {
          accumulator[i] += bf16_to_float(shared[static_cast<std::size_t>(token) * hidden + i]);
        }
      }
      apply_epilogue(args, token, hidden, accumulator.data());
      std::transform(accumulator.begin(), accumulator.end(),
                     out + static_cast<std::size_t>(token) * out_stride, float_to_bf16);
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
        if (ids[k] < 0 || !contributes(ids[k] / local_experts_)) {
          std::fill_n(out + (static_cast<std::size_t>(token) * top_k + k) * hidden, hidden, bf16_bits{0});
        }
      }
    }
  }
  combine_messages_.clear();
}

}  // namespace rocep::reference
