// The rocep Python module: EpConfig, EpGroup over a Python bootstrap, and the calls on DLPack arrays. Arrays
// live where the group's backend works: host memory (numpy, torch CPU) on the CPU reference, device memory
// (torch / cupy on the GPU) on the GPU backend; each argument is checked for dtype, shape and device before
// a call, naming the argument and what it must be. Exceptions are rocep's own classes (rocep/__init__.py).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "rocep/rocep.hpp"

namespace nb = nanobind;

namespace {

// A bootstrap whose collectives are a Python object's methods: rank() and size() (ints), all_gather(bytes)
// -> bytes (every rank's bytes, concatenated in rank order) and barrier(). Called with the GIL held.
class PythonBootstrap final : public rocep::Bootstrap {
 public:
  explicit PythonBootstrap(nb::object methods)
      : methods_(std::move(methods)),
        rank_(nb::cast<int>(methods_.attr("rank")())),
        size_(nb::cast<int>(methods_.attr("size")())) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_gather(const void* mine, void* all, std::size_t bytes_per_rank) override {
    nb::gil_scoped_acquire gil;
    const nb::bytes gathered(
        methods_.attr("all_gather")(nb::bytes(static_cast<const char*>(mine), bytes_per_rank)));
    if (gathered.size() != bytes_per_rank * static_cast<std::size_t>(size_)) {
      throw rocep::BootstrapError("bootstrap all_gather returned " + std::to_string(gathered.size()) +
                                  " bytes, expected " + std::to_string(bytes_per_rank * size_) +
                                  " (every rank's bytes, concatenated in rank order)");
    }
    std::memcpy(all, gathered.c_str(), gathered.size());
  }
  void barrier() override {
    nb::gil_scoped_acquire gil;
    methods_.attr("barrier")();
  }

 private:
  nb::object methods_;
  int rank_;
  int size_;
};

using Array = nb::ndarray<nb::c_contig>;
// An array the call only reads: read-only arrays (a broadcast view, a frozen buffer) are taken too.
using InputArray = nb::ndarray<nb::ro, nb::c_contig>;
// An array of any strides: a combine's out, which may be a slice of a wider tensor.
using StridedArray = nb::ndarray<>;

// `text` with each `from` made `to` and every other character upper case (`upper`) or lower case: an enum
// member's name from its string form ("per-token" -> "PER_TOKEN") and back.
std::string respelled(std::string text, char from, char to, bool upper) {
  for (char& character : text) {
    const auto byte = static_cast<unsigned char>(character);
    character = character == from ? to : static_cast<char>(upper ? std::toupper(byte) : std::tolower(byte));
  }
  return text;
}

// `value` as a member of Enum: the member itself, or its name as a string in any case with '-' for '_'
// ("per-token", "CPU_REFERENCE"); anything else throws Error naming `name` and the allowed values.
template <typename Enum, typename Error>
Enum enum_argument(nb::handle value, const std::string& name) {
  if (nb::isinstance<Enum>(value)) {
    return nb::cast<Enum>(value);
  }
  const nb::object members = nb::type<Enum>().attr("__members__");
  if (nb::isinstance<nb::str>(value)) {
    const std::string key = respelled(nb::cast<std::string>(value), '-', '_', /*upper=*/true);
    if (nb::cast<bool>(members.attr("__contains__")(key))) {
      return nb::cast<Enum>(members[key.c_str()]);
    }
  }
  const std::string prefix = "rocep." + nb::cast<std::string>(nb::type<Enum>().attr("__name__")) + ".";
  std::string allowed;
  std::string names;
  for (nb::handle key : members) {
    const std::string member = nb::cast<std::string>(key);
    allowed += (allowed.empty() ? "" : ", ") + prefix + member;
    names += (names.empty() ? "'" : ", '") + respelled(member, '_', '-', /*upper=*/false) + "'";
  }
  throw Error(name + " = " + nb::cast<std::string>(nb::repr(value)) + " is invalid: allowed are " + allowed +
              " (or their names as strings: " + names + ")");
}

// EpConfig's enum field `Field` as the Python attribute `name`, set from a member or its name
// (enum_argument; ConfigError naming "EpConfig.<name>").
template <typename Enum, Enum rocep::EpConfig::*Field>
void enum_field(nb::class_<rocep::EpConfig>& config_class, const char* name) {
  config_class.def_prop_rw(
      name, [](const rocep::EpConfig& config) { return config.*Field; },
      [name](rocep::EpConfig& config, nb::handle value) {
        config.*Field = enum_argument<Enum, rocep::ConfigError>(value, std::string("EpConfig.") + name);
      },
      nb::for_setter(nb::arg("value").none()));  // None too reaches enum_argument, which refuses it by name
}

// The error for an argument `name` that is no array nanobind takes as `kind` ("an array", "a writable
// array"): a list, None, a non-native byte order, an unknown array type, a read-only array for an output.
rocep::InvalidInputError not_an_array(const char* name, const char* kind, nb::handle object) {
  return rocep::InvalidInputError(std::string(name) + ": must be " + kind +
                                  " (numpy, torch, cupy or any DLPack array, native byte order), is " +
                                  nb::cast<std::string>(nb::str(object.type())));
}

// `object` as an input array (a non-contiguous one copied); throws rocep::InvalidInputError naming `name`
// where it is none that nanobind takes.
InputArray input_array(const char* name, nb::handle object) {
  try {
    return nb::cast<InputArray>(object);
  } catch (const nb::cast_error&) {
    throw not_an_array(name, "an array", object);
  }
}

// `object` as an array the call writes whole, row after row: writable and C-contiguous, else
// rocep::InvalidInputError naming `name` (a contiguous copy of a strided array would take the results away).
StridedArray dense_output_array(const char* name, nb::handle object) {
  StridedArray array;
  try {
    array = nb::cast<StridedArray>(object);
  } catch (const nb::cast_error&) {
    throw not_an_array(name, "a writable array", object);
  }
  int64_t dense_stride = 1;  // in elements, as DLPack gives strides
  for (std::size_t axis = array.ndim(); axis-- > 0;) {
    if (array.shape(axis) > 1 && array.stride(axis) != dense_stride) {
      throw rocep::InvalidInputError(std::string(name) +
                                     ": must be C-contiguous (the call writes it whole, row after row), is "
                                     "strided along dimension " +
                                     std::to_string(axis));
    }
    dense_stride *= static_cast<int64_t>(array.shape(axis));
  }
  return array;
}

// bf16 arrays: torch.bfloat16 (DLPack bfloat16), or their bits as uint16 (numpy has no bfloat16).
constexpr nb::dlpack::dtype kBfloat16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};

// An array's element type as numpy and torch name it ("float32", "bfloat16", "float8_e4m3fn"), for errors.
std::string dtype_name(nb::dlpack::dtype dtype) {
  // DLPack's type codes (DLDataTypeCode): 0-5 named with their width after them (3 is an opaque handle),
  // 6-17 named whole.
  static constexpr const char* sized[] = {"int", "uint", "float", nullptr, "bfloat", "complex"};
  static constexpr const char* whole[] = {
      "bool",           "float8_e3m4",     "float8_e4m3",   "float8_e4m3b11fnuz",
      "float8_e4m3fn",  "float8_e4m3fnuz", "float8_e5m2",   "float8_e5m2fnuz",
      "float8_e8m0fnu", "float6_e2m3fn",   "float6_e3m2fn", "float4_e2m1fn"};
  const std::size_t code = dtype.code;
  const std::string lanes = dtype.lanes == 1 ? "" : " x " + std::to_string(dtype.lanes);
  if (code < std::size(sized) && sized[code] != nullptr) {
    return sized[code] + std::to_string(dtype.bits) + lanes;
  }
  if (code >= std::size(sized) && code - std::size(sized) < std::size(whole)) {
    return whole[code - std::size(sized)] + lanes;
  }
  return "DLPack type code " + std::to_string(code) + " of " + std::to_string(dtype.bits) + " bits" + lanes;
}

// Throws rocep::InvalidInputError naming `name` unless `array` holds `dtype` (or bf16 as uint16 bits where
// `dtype` is bfloat16) with `shape` (entries < 0 are free) on GPU `device` (the group's, EpGroup::device), or
// in host memory where `device` is -1 (the CPU reference).
template <typename AnyArray>
void check(const char* name, const AnyArray& array, nb::dlpack::dtype dtype, const char* allowed_dtype,
           std::initializer_list<int64_t> shape, int device) {
  const auto fail = [&](const std::string& what) {
    throw rocep::InvalidInputError(std::string(name) + ": " + what);
  };
  const bool bf16_bits = dtype == kBfloat16 && array.dtype() == nb::dtype<uint16_t>();
  if (array.dtype() != dtype && !bf16_bits) {
    fail(std::string("dtype must be ") + allowed_dtype + ", is " + dtype_name(array.dtype()));
  }
  if (array.ndim() != shape.size()) {
    fail("must have " + std::to_string(shape.size()) + " dimensions, has " + std::to_string(array.ndim()));
  }
  std::size_t axis = 0;  // the array has shape.size() dimensions (checked above)
  std::string expected = "(";
  std::string given = "(";
  bool matches = true;
  for (const int64_t extent : shape) {
    const auto given_extent = static_cast<int64_t>(array.shape(axis));
    const char* separator = axis > 0 ? ", " : "";
    expected += separator + (extent < 0 ? std::string("any") : std::to_string(extent));
    given += separator + std::to_string(given_extent);
    matches = matches && (extent < 0 || given_extent == extent);
    ++axis;
  }
  if (!matches) {
    fail("shape must be " + expected + "), is " + given + ")");
  }
  const bool on_gpu = device >= 0;
  const bool in_gpu_memory =
      array.device_type() == nb::device::cuda::value || array.device_type() == nb::device::rocm::value;
  if (in_gpu_memory != on_gpu) {
    fail(on_gpu ? "must be in GPU memory (the group's backend is the GPU)"
                : "must be in host memory (the group's backend is the CPU reference)");
  }
  if (on_gpu && array.device_id() != device) {
    fail("is on GPU " + std::to_string(array.device_id()) + ", must be on GPU " + std::to_string(device) +
         " (the group's)");
  }
}

// Row offsets: uint32 as in C++, or int32 with the same bits (torch's uint32 tensors support few operations;
// offsets stay below 2^31).
template <typename AnyArray>
void check_row_offsets(const AnyArray& array, int64_t extent, int device) {
  const nb::dlpack::dtype dtype =
      array.dtype() == nb::dtype<int32_t>() ? nb::dtype<int32_t>() : nb::dtype<uint32_t>();
  check("row_offsets", array, dtype, "uint32 or int32", {extent}, device);
}

// The per-token layout's output arrays, in DispatchResult's order (rocep/group.py).
struct OutputArrays {
  Array tokens;
  nb::object scales;
  Array topk_ids, topk_weights, src_info, num_recv_tokens, sorted_token_ids, block_expert_ids, row_offsets;
};

// The expanded layout's output arrays, in ExpandedResult's order (rocep/group.py).
struct ExpandedOutputArrays {
  Array tokens;
  nb::object scales;
  Array row_offsets, expert_ids, src_info, weights;
};

// Throws InvalidInputError unless the group's layout is `layout`: the arrays of the other layout were passed.
void require_layout(const rocep::EpGroup& group, rocep::Layout layout) {
  if (group.config().layout != layout) {
    throw rocep::InvalidInputError(std::string("outputs: the group's layout is ") +
                                   rocep::to_string(group.config().layout) +
                                   ", but these outputs are for the " + rocep::to_string(layout) + " layout");
  }
}

// Checks the output arrays (a bad one refuses the call on this rank, as in C++) and returns them as outputs.
rocep::DispatchOutputs dispatch_outputs(const rocep::EpGroup& group, const ExpandedOutputArrays& arrays) {
  require_layout(group, rocep::Layout::kExpanded);
  const rocep::EpConfig& config = group.config();
  const int device = group.device();
  const auto rows = static_cast<int64_t>(config.max_recv_rows(group.world_size()));
  const auto payload =
      static_cast<int64_t>(rocep::format_payload_bytes(config.dispatch_format, config.hidden));
  const auto local = static_cast<int64_t>(group.num_local_experts());
  check("recv_tokens", arrays.tokens, nb::dtype<uint8_t>(), "uint8", {rows, payload}, device);
  check_row_offsets(arrays.row_offsets, local + 1, device);
  check("expert_ids", arrays.expert_ids, nb::dtype<int32_t>(), "int32", {local}, device);
  check("src_info", arrays.src_info, nb::dtype<int32_t>(), "int32", {rows, 3}, device);
  check("recv_weights", arrays.weights, nb::dtype<float>(), "float32", {rows}, device);
  rocep::DispatchOutputs outputs;
  outputs.recv_tokens = arrays.tokens.data();
  outputs.row_offsets = static_cast<uint32_t*>(arrays.row_offsets.data());
  outputs.expert_ids = static_cast<int32_t*>(arrays.expert_ids.data());
  outputs.src_info = static_cast<rocep::SrcInfo*>(arrays.src_info.data());
  outputs.recv_weights = static_cast<float*>(arrays.weights.data());
  if (config.dispatch_format != rocep::TokenFormat::kBf16) {
    const Array scales = nb::cast<Array>(arrays.scales);
    check(
        "recv_scales", scales, nb::dtype<uint8_t>(), "uint8",
        {static_cast<int64_t>(rocep::format_scale_tensor_bytes(config.dispatch_format, rows, config.hidden))},
        device);
    outputs.recv_scales = scales.data();
  }
  return outputs;
}

rocep::DispatchOutputs dispatch_outputs(const rocep::EpGroup& group, const OutputArrays& arrays) {
  require_layout(group, rocep::Layout::kPerToken);
  const rocep::EpConfig& config = group.config();
  const int device = group.device();
  const int world = group.world_size();
  const auto rows = static_cast<int64_t>(config.max_recv_tokens(world));
  const int64_t top_k = config.top_k;
  const auto payload =
      static_cast<int64_t>(rocep::format_payload_bytes(config.dispatch_format, config.hidden));
  const auto scales = static_cast<int64_t>(rocep::format_scale_bytes(config.dispatch_format, config.hidden));
  const auto entries = static_cast<int64_t>(config.max_recv_rows(world));
  check("recv_tokens", arrays.tokens, nb::dtype<uint8_t>(), "uint8", {rows, payload}, device);
  check("recv_topk_ids", arrays.topk_ids, nb::dtype<int32_t>(), "int32", {rows, top_k}, device);
  check("recv_topk_weights", arrays.topk_weights, nb::dtype<float>(), "float32", {rows, top_k}, device);
  check("src_info", arrays.src_info, nb::dtype<int32_t>(), "int32", {rows, 3}, device);
  check("num_recv_tokens", arrays.num_recv_tokens, nb::dtype<int32_t>(), "int32", {1}, device);
  check("sorted_token_ids", arrays.sorted_token_ids, nb::dtype<int32_t>(), "int32", {entries}, device);
  check("block_expert_ids", arrays.block_expert_ids, nb::dtype<int32_t>(), "int32",
        {entries / config.expert_alignment}, device);
  check_row_offsets(arrays.row_offsets, static_cast<int64_t>(group.num_local_experts()) + 1, device);
  rocep::DispatchOutputs outputs;
  outputs.recv_tokens = arrays.tokens.data();
  if (scales > 0) {
    const Array scale_rows = nb::cast<Array>(arrays.scales);
    check("recv_scales", scale_rows, nb::dtype<uint8_t>(), "uint8", {rows, scales}, device);
    outputs.recv_scales = scale_rows.data();
  }
  outputs.recv_topk_ids = static_cast<int32_t*>(arrays.topk_ids.data());
  outputs.recv_topk_weights = static_cast<float*>(arrays.topk_weights.data());
  outputs.src_info = static_cast<rocep::SrcInfo*>(arrays.src_info.data());
  outputs.num_recv_tokens = static_cast<int32_t*>(arrays.num_recv_tokens.data());
  outputs.sorted_token_ids = static_cast<int32_t*>(arrays.sorted_token_ids.data());
  outputs.block_expert_ids = static_cast<int32_t*>(arrays.block_expert_ids.data());
  outputs.row_offsets = static_cast<uint32_t*>(arrays.row_offsets.data());
  return outputs;
}

// What a rank raises after taking part in a dispatch with zero tokens for a bad argument (`what`).
std::string zero_tokens_error(const rocep::EpGroup& group, const char* what) {
  return std::string("dispatch on rank ") + std::to_string(group.rank()) + ": " + what +
         " (this rank took part with zero tokens)";
}

// The checked inputs, or, for a bad one, zero tokens and its message in *error: as in C++, this rank still
// takes part, with zero tokens, so that its peers complete; then it raises. The arrays the inputs point into
// (copies where nanobind made them contiguous) are kept in *arrays, which must outlive the call.
rocep::DispatchInputs dispatch_inputs(rocep::EpGroup& group, const nb::object& token_rows,
                                      const nb::object& ids, const nb::object& weights,
                                      const nb::object& token_scales, const nb::object& global_scale,
                                      std::vector<InputArray>* arrays, std::string* error) {
  const rocep::EpConfig& config = group.config();
  const int device = group.device();
  const auto payload =
      static_cast<int64_t>(rocep::format_payload_bytes(config.dispatch_format, config.hidden));
  const auto scales = static_cast<int64_t>(rocep::format_scale_bytes(config.dispatch_format, config.hidden));
  rocep::DispatchInputs inputs;
  try {
    const InputArray tokens = input_array("tokens", token_rows);
    const InputArray topk_ids = input_array("topk_ids", ids);
    const InputArray topk_weights = input_array("topk_weights", weights);
    const int64_t given = static_cast<int64_t>(topk_ids.ndim() > 0 ? topk_ids.shape(0) : 0);
    // A scaled format's rows of the input buffer: each token's payload, then its scales (uint8 rows). No
    // rows at all (buffer[:0]) count too: an empty array's data pointer is not always the buffer's.
    const bool in_buffer = token_scales.is_none() && config.dispatch_format != rocep::TokenFormat::kBf16 &&
                           tokens.dtype() == nb::dtype<uint8_t>() &&
                           (given == 0 || tokens.data() == group.dispatch_input_buffer());
    if (in_buffer) {
      const auto row_bytes =
          static_cast<int64_t>(rocep::format_input_row_bytes(config.dispatch_format, config.hidden));
      check("tokens", tokens, nb::dtype<uint8_t>(), "uint8 (rows of dispatch_input_buffer())",
            {given, row_bytes}, device);
    } else if (token_scales.is_none()) {
      check("tokens", tokens, kBfloat16, "bfloat16 (or its bits as uint16)", {given, config.hidden}, device);
    } else {
      check("tokens", tokens, nb::dtype<uint8_t>(), "uint8 (quantised payload bytes)", {given, payload},
            device);
      const InputArray given_scales = input_array("token_scales", token_scales);
      check("token_scales", given_scales, nb::dtype<uint8_t>(), "uint8", {given, scales}, device);
      inputs.token_scales = given_scales.data();
      arrays->push_back(given_scales);
    }
    check("topk_ids", topk_ids, nb::dtype<int32_t>(), "int32 (rocep.Group takes int64 too)",
          {-1, config.top_k}, device);
    check("topk_weights", topk_weights, nb::dtype<float>(), "float32", {given, config.top_k}, device);
    if (!global_scale.is_none()) {
      const InputArray scale = input_array("global_scale", global_scale);
      check("global_scale", scale, nb::dtype<float>(), "float32", {1}, device);
      inputs.global_scale = static_cast<const float*>(scale.data());
      arrays->push_back(scale);
    }
    inputs.tokens = in_buffer ? group.dispatch_input_buffer() : tokens.data();
    inputs.topk_ids = static_cast<const int32_t*>(topk_ids.data());
    inputs.topk_weights = static_cast<const float*>(topk_weights.data());
    inputs.num_tokens = static_cast<int>(given);
    arrays->insert(arrays->end(), {tokens, topk_ids, topk_weights});
  } catch (const rocep::InvalidInputError& bad) {
    *error = zero_tokens_error(group, bad.what());
    inputs = rocep::DispatchInputs{};
  }
  return inputs;
}

// Raised after this rank's part of the call was issued with zero tokens (InvalidInputError::issued).
void raise_if(const std::string& error) {
  if (!error.empty()) {
    throw rocep::InvalidInputError(error, true);
  }
}

// Per-token: expert_outputs [P, hidden], out [T, hidden]. Expanded: expert_outputs [R, hidden]; weighted
// (row_weights [R]) out [T, hidden], unweighted out [T, top_k, hidden]. A reduced combine's out may be a
// slice of a wider tensor (its row stride becomes out_row_stride) and may take the epilogue: factor,
// token_factors [T] float32, residual [T, hidden] bf16. The input arrays the arguments point into (copies
// where nanobind made them contiguous) are kept in *arrays, which must outlive the call.
rocep::CombineArgs combine_args(const rocep::EpGroup& group, const nb::object& expert_rows,
                                const nb::object& row_weights, const nb::object& shared_expert_output,
                                const StridedArray& out, float factor, const nb::object& token_factors,
                                const nb::object& residual, std::vector<InputArray>* arrays) {
  const rocep::EpConfig& config = group.config();
  const int device = group.device();
  const bool per_token = config.layout == rocep::Layout::kPerToken;
  const auto rows = static_cast<int64_t>(per_token ? config.max_recv_tokens(group.world_size())
                                                   : config.max_recv_rows(group.world_size()));
  const InputArray expert_outputs = input_array("expert_outputs", expert_rows);
  arrays->push_back(expert_outputs);
  try {
    check("expert_outputs", expert_outputs, kBfloat16, "bfloat16 (or its bits as uint16)",
          {rows, config.hidden}, device);
  } catch (const rocep::InvalidInputError& bad) {
    throw rocep::InvalidInputError(std::string(bad.what()) +
                                   (per_token
                                        ? " (rows: max_recv_tokens(world) = world x max_tokens_per_rank, "
                                          "row i for received token i)"
                                        : " (rows: max_recv_rows(world), row i for dispatched row i)"));
  }
  rocep::CombineArgs args{expert_outputs.data(), nullptr, nullptr, nullptr};
  if (!row_weights.is_none()) {
    if (per_token) {
      throw rocep::InvalidInputError(
          "row_weights: must be None in the per-token layout (each row is already weighted and summed)");
    }
    const InputArray weights = input_array("row_weights", row_weights);
    arrays->push_back(weights);
    check("row_weights", weights, nb::dtype<float>(), "float32", {rows}, device);
    args.row_weights = static_cast<const float*>(weights.data());
  }
  const bool reduced = per_token || args.row_weights != nullptr;
  if (reduced) {
    check("out", out, kBfloat16, "bfloat16 (or its bits as uint16)", {-1, config.hidden}, device);
    if (out.shape(0) > 0 && out.stride(1) != 1) {
      throw rocep::InvalidInputError("out: each row must be contiguous (stride 1 along hidden), has stride " +
                                     std::to_string(out.stride(1)));
    }
    const int64_t row_stride = out.shape(0) > 1 ? out.stride(0) : config.hidden;
    if (row_stride != config.hidden) {
      if (row_stride < config.hidden) {
        throw rocep::InvalidInputError(
            "out: rows must be at least hidden = " + std::to_string(config.hidden) + " elements apart, are " +
            std::to_string(row_stride));
      }
      args.out_row_stride = static_cast<std::size_t>(row_stride);
    }
  } else {
    check("out", out, kBfloat16, "bfloat16 (or its bits as uint16)", {-1, config.top_k, config.hidden},
          device);
    const bool contiguous = out.stride(2) == 1 && out.stride(1) == config.hidden &&
                            (out.shape(0) <= 1 || out.stride(0) == int64_t{config.top_k} * config.hidden);
    if (!contiguous) {
      throw rocep::InvalidInputError("out: must be contiguous for the unweighted combine");
    }
  }
  args.out = out.data();
  args.factor = factor;
  const auto tokens = static_cast<int64_t>(out.shape(0));
  if (!token_factors.is_none()) {
    const InputArray factors = input_array("token_factors", token_factors);
    arrays->push_back(factors);
    check("token_factors", factors, nb::dtype<float>(), "float32", {tokens}, device);
    args.token_factors = static_cast<const float*>(factors.data());
  }
  if (!residual.is_none()) {
    const InputArray rows_added = input_array("residual", residual);
    arrays->push_back(rows_added);
    check("residual", rows_added, kBfloat16, "bfloat16 (or its bits as uint16)", {tokens, config.hidden},
          device);
    args.residual = rows_added.data();
  }
  if (!shared_expert_output.is_none()) {
    const InputArray shared = input_array("shared_expert_output", shared_expert_output);
    arrays->push_back(shared);
    check("shared_expert_output", shared, kBfloat16, "bfloat16 (or its bits as uint16)",
          {tokens, config.hidden}, device);
    args.shared_expert_output = shared.data();
  }
  return args;
}

// The outputs of either layout (each checked against the group's layout), with the expanded layout's
// optional expert input scales, float32 [L] (include/rocep/types.hpp; the layout and format are checked by
// the call), their array kept in *arrays, which must outlive the call.
template <typename Outputs>
rocep::DispatchOutputs dispatch_outputs_with(const rocep::EpGroup& group, const Outputs& outputs,
                                             const nb::object& expert_input_scales,
                                             std::vector<InputArray>* arrays) {
  rocep::DispatchOutputs checked = dispatch_outputs(group, outputs);
  if (!expert_input_scales.is_none()) {
    const InputArray scales = input_array("expert_input_scales", expert_input_scales);
    arrays->push_back(scales);
    check("expert_input_scales", scales, nb::dtype<float>(), "float32",
          {static_cast<int64_t>(group.config().num_local_experts(group.world_size()))}, group.device());
    checked.expert_input_scales = static_cast<const float*>(scales.data());
  }
  return checked;
}

// dispatch on arrays.
template <typename Outputs>
void dispatch_on_arrays(rocep::EpGroup& group, const nb::object& tokens, const nb::object& topk_ids,
                        const nb::object& topk_weights, const nb::object& token_scales,
                        const nb::object& global_scale, const Outputs& outputs,
                        const nb::object& expert_input_scales, std::uintptr_t stream) {
  std::vector<InputArray> arrays;
  std::string input_error;
  rocep::DispatchOutputs checked;
  try {
    checked = dispatch_outputs_with(group, outputs, expert_input_scales, &arrays);
  } catch (const rocep::InvalidInputError& bad) {  // bad scales: as for bad inputs, zero tokens, no scales
    input_error = zero_tokens_error(group, bad.what());
    checked = dispatch_outputs(group, outputs);
  }
  const rocep::DispatchInputs inputs =
      input_error.empty() ? dispatch_inputs(group, tokens, topk_ids, topk_weights, token_scales, global_scale,
                                            &arrays, &input_error)
                          : rocep::DispatchInputs{};
  {
    nb::gil_scoped_release release;
    group.dispatch(inputs, checked, reinterpret_cast<void*>(stream));
  }
  raise_if(input_error);
}

template <typename Outputs>
void dispatch_recv_on_arrays(rocep::EpGroup& group, const Outputs& outputs,
                             const nb::object& expert_input_scales, std::uintptr_t stream) {
  std::vector<InputArray> arrays;
  const rocep::DispatchOutputs checked = dispatch_outputs_with(group, outputs, expert_input_scales, &arrays);
  nb::gil_scoped_release release;
  group.dispatch_recv(checked, reinterpret_cast<void*>(stream));
}

// One of EpGroup's combine calls (combine, combine_send, combine_recv) on arrays.
using CombineCall = void (rocep::EpGroup::*)(const rocep::CombineArgs&, void*);

template <CombineCall kCall>
void combine_on_arrays(rocep::EpGroup& group, const nb::object& expert_outputs, const nb::object& row_weights,
                       const nb::object& shared_expert_output, const StridedArray& out, float factor,
                       const nb::object& token_factors, const nb::object& residual, std::uintptr_t stream) {
  std::vector<InputArray> arrays;
  rocep::CombineArgs args;
  try {
    args = combine_args(group, expert_outputs, row_weights, shared_expert_output, out, factor, token_factors,
                        residual, &arrays);
  } catch (const rocep::InvalidInputError& bad) {
    throw rocep::InvalidInputError(std::string(bad.what()) +
                                   "; refused on this rank, nothing issued: its peers wait until it repeats "
                                   "the call with valid arguments");
  }
  nb::gil_scoped_release release;
  (group.*kCall)(args, reinterpret_cast<void*>(stream));
}

}  // namespace

NB_MODULE(_rocep, m) {
  // A group or config that a script keeps in a global is still alive when the interpreter exits; that is
  // not a leak of rocep's.
  nb::set_leak_warnings(false);
  nb::class_<OutputArrays>(m, "OutputArrays")
      .def(
          "__init__",
          [](OutputArrays* arrays, Array tokens, nb::object scales, Array topk_ids, Array topk_weights,
             Array src_info, Array num_recv_tokens, Array sorted_token_ids, Array block_expert_ids,
             Array row_offsets) {
            new (arrays)
                OutputArrays{tokens,          scales,           topk_ids,         topk_weights, src_info,
                             num_recv_tokens, sorted_token_ids, block_expert_ids, row_offsets};
          },
          nb::arg("tokens"), nb::arg("scales").none(), nb::arg("topk_ids"), nb::arg("topk_weights"),
          nb::arg("src_info"), nb::arg("num_recv_tokens"), nb::arg("sorted_token_ids"),
          nb::arg("block_expert_ids"), nb::arg("row_offsets"));
  nb::class_<ExpandedOutputArrays>(m, "ExpandedOutputArrays")
      .def(
          "__init__",
          [](ExpandedOutputArrays* arrays, Array tokens, nb::object scales, Array row_offsets,
             Array expert_ids, Array src_info, Array weights) {
            new (arrays) ExpandedOutputArrays{tokens, scales, row_offsets, expert_ids, src_info, weights};
          },
          nb::arg("tokens"), nb::arg("scales").none(), nb::arg("row_offsets"), nb::arg("expert_ids"),
          nb::arg("src_info"), nb::arg("weights"));
  nb::enum_<rocep::TokenFormat>(m, "TokenFormat")
      .value("BF16", rocep::TokenFormat::kBf16)
      .value("FP8_BLOCK128", rocep::TokenFormat::kFp8Block128)
      .value("MXFP4", rocep::TokenFormat::kMxfp4)
      .value("NVFP4", rocep::TokenFormat::kNvfp4)
      .value("MXFP8", rocep::TokenFormat::kMxfp8);
  nb::enum_<rocep::Fp8Encoding>(m, "Fp8Encoding")
      .value("AUTO", rocep::Fp8Encoding::kAuto)
      .value("E4M3FN", rocep::Fp8Encoding::kE4m3fn)
      .value("E4M3FNUZ", rocep::Fp8Encoding::kE4m3fnuz);
  nb::enum_<rocep::CombineDtype>(m, "CombineDtype")
      .value("BF16", rocep::CombineDtype::kBf16)
      .value("FP8_BLOCK128", rocep::CombineDtype::kFp8Block128);
  nb::enum_<rocep::Layout>(m, "Layout")
      .value("EXPANDED", rocep::Layout::kExpanded)
      .value("PER_TOKEN", rocep::Layout::kPerToken);
  nb::enum_<rocep::Backend>(m, "Backend")
      .value("AUTO", rocep::Backend::kAuto)
      .value("GPU", rocep::Backend::kGpu)
      .value("CPU_REFERENCE", rocep::Backend::kCpuReference);
  // Arithmetic: a kind compares equal to its number (0, 1, 2), which callers of poll_error may test.
  nb::enum_<rocep::RecordedError::Kind>(m, "RecordedErrorKind", nb::is_arithmetic())
      .value("NONE", rocep::RecordedError::Kind::kNone)
      .value("INVALID_INPUT", rocep::RecordedError::Kind::kInvalidInput)
      .value("TIMEOUT", rocep::RecordedError::Kind::kTimeout);

  nb::class_<rocep::EpConfig> config_class(m, "EpConfig");
  config_class
      .def(nb::init<>())
      // EpConfig(hidden=7168, top_k=8, ...), EpConfig(other, num_sms=24): the defaults (or `other`) with the
      // fields named set as attributes are.
      .def(
          "__init__",
          [](rocep::EpConfig* config, const rocep::EpConfig* other, const nb::kwargs& fields) {
            const nb::handle type = nb::type<rocep::EpConfig>();
            const nb::object property = nb::module_::import_("builtins").attr("property");
            const nb::object attributes = type.attr("__dict__");
            nb::object built = type();
            if (other != nullptr) {
              nb::cast<rocep::EpConfig&>(built) = *other;
            }
            for (const auto& [name, value] : fields) {
              if (!nb::isinstance(attributes.attr("get")(name), property)) {
                std::string known;
                for (nb::handle field : attributes) {
                  if (nb::isinstance(attributes[field], property)) {
                    known += (known.empty() ? "" : ", ") + nb::cast<std::string>(field);
                  }
                }
                throw rocep::ConfigError("EpConfig has no field " + nb::cast<std::string>(nb::repr(name)) +
                                         ": its fields are " + known);
              }
              nb::setattr(built, name, value);
            }
            new (config) rocep::EpConfig(nb::cast<const rocep::EpConfig&>(built));
          },
          nb::arg("other").none() = nb::none(), nb::arg("fields"))
      .def_rw("hidden", &rocep::EpConfig::hidden)
      .def_rw("top_k", &rocep::EpConfig::top_k)
      .def_rw("num_experts", &rocep::EpConfig::num_experts)
      .def_rw("max_tokens_per_rank", &rocep::EpConfig::max_tokens_per_rank)
      .def_rw("gpus_per_node", &rocep::EpConfig::gpus_per_node)
      .def_rw("num_sms", &rocep::EpConfig::num_sms)
      .def_rw("expert_alignment", &rocep::EpConfig::expert_alignment)
      .def_rw("timeout_seconds", &rocep::EpConfig::timeout_seconds)
      .def_rw("local_only", &rocep::EpConfig::local_only)
      .def_rw("allreduce_world_size", &rocep::EpConfig::allreduce_world_size)
      .def_rw("combine_input_buffer", &rocep::EpConfig::combine_input_buffer)
      .def("validate", &rocep::EpConfig::validate, nb::arg("world_size"))
      .def("num_local_experts", &rocep::EpConfig::num_local_experts, nb::arg("world_size"))
      .def("max_recv_rows", &rocep::EpConfig::max_recv_rows, nb::arg("world_size"))
      .def("max_recv_tokens", &rocep::EpConfig::max_recv_tokens, nb::arg("world_size"))
      .def("__repr__", [](const rocep::EpConfig& config) { return "EpConfig(" + config.describe() + ")"; });
  enum_field<rocep::TokenFormat, &rocep::EpConfig::dispatch_format>(config_class, "dispatch_format");
  enum_field<rocep::Fp8Encoding, &rocep::EpConfig::fp8_encoding>(config_class, "fp8_encoding");
  enum_field<rocep::CombineDtype, &rocep::EpConfig::combine_dtype>(config_class, "combine_dtype");
  enum_field<rocep::Layout, &rocep::EpConfig::layout>(config_class, "layout");
  m.attr("DEFAULT_SMS") = rocep::EpConfig::kDefaultSms;
  m.attr("ALL_SMS") = rocep::EpConfig::kAllSms;
  m.def("format_payload_bytes", &rocep::format_payload_bytes, nb::arg("format"), nb::arg("hidden"));
  m.def("format_scale_bytes", &rocep::format_scale_bytes, nb::arg("format"), nb::arg("hidden"));
  m.def("format_input_row_bytes", &rocep::format_input_row_bytes, nb::arg("format"), nb::arg("hidden"));
  m.def("format_scale_tensor_bytes", &rocep::format_scale_tensor_bytes, nb::arg("format"), nb::arg("rows"),
        nb::arg("columns"));
  m.def(
      "build_info",
      [] {
        const rocep::BuildInfo info = rocep::build_info();
        nb::dict fields;
        fields["version"] = info.version;
        fields["gpu_platform"] = info.gpu_platform;
        fields["gpu_architectures"] = info.gpu_architectures;
        fields["shmem_engine"] = info.shmem_engine;
        fields["profiler_ranges"] = info.profiler_ranges;
        return fields;
      },
      "What this build of rocep is (include/rocep/build_info.hpp): version, gpu_platform (amd, nvidia or "
      "none: the CPU reference only), gpu_architectures, shmem_engine, profiler_ranges.");

  // The per-token layout's calls on arrays (the layout the Python package serves; types.hpp has the
  // fields). Streams: the GPU backend's calls take a stream handle (an int, 0 = the default stream).
  nb::class_<rocep::EpGroup>(m, "EpGroup")
      .def(
          "__init__",
          [](rocep::EpGroup* group, nb::object bootstrap, const rocep::EpConfig& config, nb::handle backend) {
            const auto chosen = enum_argument<rocep::Backend, rocep::ConfigError>(backend, "backend");
            auto adapter = std::make_shared<PythonBootstrap>(std::move(bootstrap));
            nb::gil_scoped_release release;  // the adapter takes the GIL back for each collective
            new (group) rocep::EpGroup(adapter, config, chosen);
          },
          nb::arg("bootstrap"), nb::arg("config"), nb::arg("backend").none() = rocep::Backend::kAuto)
      .def_prop_ro("rank", &rocep::EpGroup::rank)
      .def_prop_ro("world_size", &rocep::EpGroup::world_size)
      // A copy: a group's configuration is fixed at its creation (the backends hold their own).
      .def_prop_ro("config", [](const rocep::EpGroup& group) { return group.config(); })
      .def_prop_ro("backend", &rocep::EpGroup::backend)
      .def_prop_ro("num_local_experts", &rocep::EpGroup::num_local_experts)
      .def_prop_ro("max_recv_rows", &rocep::EpGroup::max_recv_rows)
      .def_prop_ro("memory_bytes", &rocep::EpGroup::memory_bytes)
      .def_prop_ro("device", &rocep::EpGroup::device)
      // The addresses of the group's input buffers (EpGroup::dispatch_input_buffer, combine_input_buffer):
      // rocep.Group wraps them in arrays of its library.
      .def("dispatch_input_buffer_address",
           [](rocep::EpGroup& group) {
             return reinterpret_cast<std::uintptr_t>(group.dispatch_input_buffer());
           })
      .def("combine_input_buffer_address",
           [](rocep::EpGroup& group) {
             return reinterpret_cast<std::uintptr_t>(group.combine_input_buffer());
           })
      .def("dispatch", &dispatch_on_arrays<OutputArrays>, nb::arg("tokens").none(),
           nb::arg("topk_ids").none(), nb::arg("topk_weights").none(), nb::arg("token_scales").none(),
           nb::arg("global_scale").none(), nb::arg("outputs"),
           nb::arg("expert_input_scales").none() = nb::none(), nb::arg("stream") = 0)
      .def("dispatch", &dispatch_on_arrays<ExpandedOutputArrays>, nb::arg("tokens").none(),
           nb::arg("topk_ids").none(), nb::arg("topk_weights").none(), nb::arg("token_scales").none(),
           nb::arg("global_scale").none(), nb::arg("outputs"),
           nb::arg("expert_input_scales").none() = nb::none(), nb::arg("stream") = 0)
      .def("dispatch_recv", &dispatch_recv_on_arrays<OutputArrays>, nb::arg("outputs"),
           nb::arg("expert_input_scales").none() = nb::none(), nb::arg("stream") = 0)
      .def("dispatch_recv", &dispatch_recv_on_arrays<ExpandedOutputArrays>, nb::arg("outputs"),
           nb::arg("expert_input_scales").none() = nb::none(), nb::arg("stream") = 0)
      .def(
          "dispatch_send",
          [](rocep::EpGroup& group, nb::object tokens, nb::object topk_ids, nb::object topk_weights,
             nb::object token_scales, nb::object global_scale, std::uintptr_t stream) {
            std::string input_error;
            std::vector<InputArray> arrays;
            const rocep::DispatchInputs inputs = dispatch_inputs(
                group, tokens, topk_ids, topk_weights, token_scales, global_scale, &arrays, &input_error);
            {
              nb::gil_scoped_release release;
              group.dispatch_send(inputs, reinterpret_cast<void*>(stream));
            }
            raise_if(input_error);
          },
          nb::arg("tokens").none(), nb::arg("topk_ids").none(), nb::arg("topk_weights").none(),
          nb::arg("token_scales").none(), nb::arg("global_scale").none(), nb::arg("stream") = 0)
      .def("combine", &combine_on_arrays<&rocep::EpGroup::combine>, nb::arg("expert_outputs").none(),
           nb::arg("row_weights").none(), nb::arg("shared_expert_output").none(), nb::arg("out"),
           nb::arg("factor") = 1.0f, nb::arg("token_factors").none() = nb::none(),
           nb::arg("residual").none() = nb::none(), nb::arg("stream") = 0)
      .def("combine_send", &combine_on_arrays<&rocep::EpGroup::combine_send>,
           nb::arg("expert_outputs").none(), nb::arg("row_weights").none(),
           nb::arg("shared_expert_output").none(), nb::arg("out"), nb::arg("factor") = 1.0f,
           nb::arg("token_factors").none() = nb::none(), nb::arg("residual").none() = nb::none(),
           nb::arg("stream") = 0)
      .def("combine_recv", &combine_on_arrays<&rocep::EpGroup::combine_recv>,
           nb::arg("expert_outputs").none(), nb::arg("row_weights").none(),
           nb::arg("shared_expert_output").none(), nb::arg("out"), nb::arg("factor") = 1.0f,
           nb::arg("token_factors").none() = nb::none(), nb::arg("residual").none() = nb::none(),
           nb::arg("stream") = 0)
      .def(
          "synchronize",
          [](rocep::EpGroup& group, std::uintptr_t stream) {
            nb::gil_scoped_release release;
            group.synchronize(reinterpret_cast<void*>(stream));
          },
          nb::arg("stream") = 0)
      .def("close",
           [](rocep::EpGroup& group) {
             nb::gil_scoped_release release;  // the bootstrap's collectives take the GIL back
             group.close();
           })
      .def("poll_error", [](rocep::EpGroup& group) {
        rocep::RecordedError error;
        {
          nb::gil_scoped_release release;  // a watchdog thread's poll waits for a copy, not for Python
          error = group.poll_error();
        }
        return nb::make_tuple(error.kind, error.message);
      });

  // The fused SiLU + quantisation (include/rocep/silu.hpp): host arrays run the CPU reference, device arrays
  // the GPU kernels on `stream`.
  m.def(
      "silu_and_quantize",
      [](nb::handle gate_up_argument, nb::handle out_argument, nb::object out_scales,
         nb::handle row_offsets_argument, int n, nb::handle format_argument, nb::handle fp8_encoding,
         nb::object global_scales, bool interleaved, float clamp_limit, std::uintptr_t stream) {
        const auto format =
            enum_argument<rocep::TokenFormat, rocep::InvalidInputError>(format_argument, "format");
        const InputArray gate_up = input_array("gate_up", gate_up_argument);
        const StridedArray out = dense_output_array("out", out_argument);
        const InputArray row_offsets = input_array("row_offsets", row_offsets_argument);
        // Every array on gate_up's GPU (the kernels run on the calling thread's current one), or in host
        // memory.
        const int device = gate_up.device_type() != nb::device::cpu::value ? gate_up.device_id() : -1;
        check("gate_up", gate_up, kBfloat16, "bfloat16 (or its bits as uint16)",
              {-1, 2 * static_cast<int64_t>(n)}, device);
        const auto rows = static_cast<int64_t>(gate_up.shape(0));
        const auto payload = static_cast<int64_t>(rocep::format_payload_bytes(format, n));
        if (format == rocep::TokenFormat::kBf16) {
          check("out", out, kBfloat16, "bfloat16 (or its bits as uint16)", {rows, n}, device);
        } else {
          check("out", out, nb::dtype<uint8_t>(), "uint8", {rows, payload}, device);
        }
        check_row_offsets(row_offsets, -1, device);
        rocep::SiluArgs args;
        args.gate_up = gate_up.data();
        args.out = out.data();
        args.row_offsets = static_cast<const uint32_t*>(row_offsets.data());
        args.num_groups = static_cast<int>(row_offsets.shape(0)) - 1;
        args.n = n;
        args.capacity_rows = static_cast<std::size_t>(rows);
        args.format = format;
        args.fp8_encoding =
            enum_argument<rocep::Fp8Encoding, rocep::InvalidInputError>(fp8_encoding, "fp8_encoding");
        args.interleaved = interleaved;
        args.clamp_limit = clamp_limit;
        StridedArray scales;
        if (!out_scales.is_none()) {
          scales = dense_output_array("out_scales", out_scales);
          check("out_scales", scales, nb::dtype<uint8_t>(), "uint8",
                {static_cast<int64_t>(rocep::format_scale_tensor_bytes(format, rows, n))}, device);
          args.out_scales = scales.data();
        }
        InputArray group_scales;  // alive through the call: a copy where nanobind made the array contiguous
        if (!global_scales.is_none()) {
          group_scales = input_array("global_scales", global_scales);
          check("global_scales", group_scales, nb::dtype<float>(), "float32", {args.num_groups}, device);
          args.global_scales = static_cast<const float*>(group_scales.data());
        }
        nb::gil_scoped_release release;
        if (device >= 0) {
          rocep::silu_and_quantize(args, reinterpret_cast<void*>(stream));
        } else {
          rocep::silu_and_quantize_reference(args);
        }
      },
      nb::arg("gate_up").none(), nb::arg("out").none(), nb::arg("out_scales").none(),
      nb::arg("row_offsets").none(), nb::arg("n"), nb::arg("format") = rocep::TokenFormat::kBf16,
      nb::arg("fp8_encoding") = rocep::Fp8Encoding::kAuto, nb::arg("global_scales").none() = nb::none(),
      nb::arg("interleaved") = false, nb::arg("clamp_limit") = 0.0f, nb::arg("stream") = 0);

  // rocep's exceptions as Python classes (rocep/__init__.py names them): nanobind translates each C++ class
  // to the registered Python one.
  static nb::exception<rocep::Error> error(m, "Error");
  static nb::exception<rocep::ConfigError> config_error(m, "ConfigError", error);
  static nb::exception<rocep::InvalidInputError> invalid_input(m, "InvalidInputError", error);
  static nb::exception<rocep::CallOrderError> call_order(m, "CallOrderError", error);
  static nb::exception<rocep::TimeoutError> timeout(m, "TimeoutError", error);
  static nb::exception<rocep::BootstrapError> bootstrap(m, "BootstrapError", error);
  static nb::exception<rocep::GpuRuntimeError> gpu_runtime(m, "GpuRuntimeError", error);
  // InvalidInputError.issued: InvalidInputError::issued(), False unless set (the class's default). Tried
  // before the translator nb::exception registered.
  invalid_input.attr("issued") = false;
  nb::register_exception_translator([](const std::exception_ptr& thrown, void*) {
    try {
      std::rethrow_exception(thrown);
    } catch (const rocep::InvalidInputError& bad) {
      nb::object raised = invalid_input(bad.what());
      raised.attr("issued") = bad.issued();
      PyErr_SetObject(invalid_input.ptr(), raised.ptr());
    }
  });
}
