"""The native API on arrays: a group that allocates its outputs, in either layout (Group's `layout`).

On the CPU reference the arrays are numpy arrays (bf16 as uint16 bits). On the GPU backend the group's array
library (Group's `arrays`: torch when it is installed, else cupy) allocates the outputs on the current
device, and calls go on that library's current stream; inputs may be any DLPack array of either.
"""

import sys
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import _rocep
from .bootstrap import gathered as _gathered


class RecordedError(NamedTuple):
    """What the kernels recorded so far (Group.poll_error), as C++'s rocep::RecordedError: false where
    nothing was; a (kind, message) pair, kind comparing equal to its number (0 none, 1, 2)."""

    Kind = _rocep.RecordedErrorKind  # NONE, INVALID_INPUT (a slot dropped, a count out of range), TIMEOUT

    kind: Any  # RecordedError.Kind
    message: str  # names the operation, the rank and what went wrong; empty for NONE

    def __bool__(self) -> bool:
        return self.kind != RecordedError.Kind.NONE


class _GroupTag:
    """What a result knows of the group that made it: which one (by identity) and its config. Not the group
    itself, so that a result kept for out= does not keep its group's memory and collectives alive."""

    def __init__(self, config: "_rocep.EpConfig"):
        self.config = config


@dataclass
class DispatchResult:
    """What dispatch wrote on this rank (the per-token layout of include/rocep/types.hpp)."""

    tokens: Any  # [P, hidden] bf16 (uint16 bits in numpy and cupy); scaled formats their codes (docs/python.md)
    scales: Any  # [P, scales per row] in the format's scale dtype (docs/python.md), or None for bf16
    topk_ids: Any  # [P, top_k] int32: local expert, -1 elsewhere
    topk_weights: Any  # [P, top_k] float32
    src_info: Any  # [P, 3] int32: source rank, source token, -1
    num_recv_tokens: Any  # [1] int32: the rows below it are this call's
    sorted_token_ids: Any  # [R] int32
    block_expert_ids: Any  # [R / expert_alignment] int32
    row_offsets: Any  # [L + 1] uint32 (int32 in torch): row_offsets[L] = num_tokens_post_padded
    native: Any = None  # the arrays as the module takes them, converted once
    group: Any = None  # the _GroupTag of the group the arrays belong to (a result does not keep a group alive)

    def count(self) -> int:
        return int(np.asarray(_to_host(self.num_recv_tokens))[0])


@dataclass
class ExpandedResult:
    """What dispatch wrote on this rank in the expanded layout: a row per (token, local expert), expert by
    expert (include/rocep/types.hpp)."""

    tokens: Any  # [R, hidden] bf16 (uint16 bits in numpy and cupy); scaled formats their codes (docs/python.md)
    scales: Any  # the scale tensor in its formats.hpp layout and the format's scale dtype, or None for bf16
    row_offsets: Any  # [L + 1] uint32 (int32 in torch): expert e's rows are [row_offsets[e], row_offsets[e + 1])
    expert_ids: Any  # [L] int32
    src_info: Any  # [R, 3] int32: source rank, source token, k
    weights: Any  # [R] float32: the router weight of the row's (token, expert) pair
    native: Any = None  # the arrays as the module takes them, converted once
    group: Any = None  # the _GroupTag of the group the arrays belong to (a result does not keep a group alive)

    def count(self) -> int:
        return int(np.asarray(_to_host(self.row_offsets))[-1])

    def input_scaled_tokens(self):
        """After a dispatch with expert_input_scales: the rows' fp8 codes [R, hidden], a view of tokens'
        first R * hidden bytes, in torch in the group's fp8 dtype (EpConfig.fp8_encoding), else uint8."""
        rows, hidden = self.tokens.shape
        return _typed(_bytes(self.tokens).reshape(-1)[:rows * hidden].reshape(rows, hidden), "fp8",
                      self.group.config)


# Dtypes of pre-quantised payloads and their scales, per dispatch format (torch's names; uint8 = the bytes).
_PAYLOAD_DTYPES = {
    _rocep.TokenFormat.FP8_BLOCK128: ("uint8", "float8_e4m3fn", "float8_e4m3fnuz"),
    _rocep.TokenFormat.MXFP8: ("uint8", "float8_e4m3fn"),
}
_SCALE_DTYPES = {
    _rocep.TokenFormat.FP8_BLOCK128: ("float32",),
    _rocep.TokenFormat.MXFP8: ("uint8", "float8_e8m0fnu"),
    _rocep.TokenFormat.MXFP4: ("uint8", "float8_e8m0fnu"),
    _rocep.TokenFormat.NVFP4: ("uint8", "float8_e4m3fn"),
}


# How dispatch's outputs present the received bytes, per dispatch format: (payload dtype, scale dtype, the
# expanded layout's scale tensor shape), torch's names, "fp8" the group's encoding. Where the array library
# lacks a dtype (numpy and cupy have no bfloat16 and no fp8, older torch no e8m0), bf16 comes as uint16
# bits and the rest as uint8 bytes. Per-token scales are [P, scales per row]; the expanded layout's are the
# formats.hpp tensors: fp8 block-128 transposed [hidden / 128, R], MX [R, hidden / 32], nvfp4's swizzled
# tiles flat.
_OUTPUT_TYPES = {
    _rocep.TokenFormat.BF16: ("bfloat16", None, None),
    _rocep.TokenFormat.FP8_BLOCK128: ("fp8", "float32", "transposed"),
    _rocep.TokenFormat.MXFP8: ("float8_e4m3fn", "float8_e8m0fnu", "rows"),
    _rocep.TokenFormat.MXFP4: ("uint8", "float8_e8m0fnu", "rows"),
    _rocep.TokenFormat.NVFP4: ("uint8", "float8_e4m3fn", "tiles"),
}


def _issued(message: str):
    """The InvalidInputError of a call that went ahead on this rank anyway (its `issued` is True, as the
    library's own for bad dispatch inputs): the group expects the next call, not this one again."""
    error = _rocep.InvalidInputError(message)
    error.issued = True
    return error


def _torch():
    import torch

    return torch


_GPU_ARRAYS = ("torch", "cupy")


def _warn_of_a_build_without_gpu():
    """Backend.AUTO put a group on the CPU reference in a process whose torch sees a GPU: a RuntimeWarning if
    the cause is the build (no GPU platform, as when no GPU compiler was found when it was installed)."""
    torch = sys.modules.get("torch")
    if _rocep.build_info()["gpu_platform"] == "none" and torch is not None and torch.cuda.is_available():
        warnings.warn("rocep: this build has no GPU platform (rocep.build_info()), so the group runs on the CPU "
                      "reference although torch sees a GPU; reinstall rocep where nvcc or hipcc is found "
                      "(docs/python.md), or pass backend=rocep.Backend.CPU_REFERENCE to mean it",
                      RuntimeWarning, stacklevel=3)


def _gpu_arrays(arrays):
    """The GPU backend's array library: `arrays`, or None for torch if importable, else cupy."""
    for name in (arrays,) if arrays else _GPU_ARRAYS:
        try:
            __import__(name)
            return name
        except ImportError:
            pass
    raise _rocep.ConfigError(f"the GPU backend needs {arrays or 'torch or cupy'} for its arrays: install it")


class _DeviceMemory:
    """Device memory of a group, as __cuda_array_interface__ describes it to torch and cupy; keeps the
    group alive while an array made from it holds it."""

    def __init__(self, address: int, shape, typestr: str, owner):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (address, False),
                                         "version": 3, "strides": None, "stream": None}
        self._owner = owner


class _HostMemory:
    """Host memory of a group (the CPU reference's), as __array_interface__ describes it to numpy: bf16 bits
    as uint16, or bytes; keeps the group alive while an array made from it holds it."""

    def __init__(self, address: int, shape, owner, typestr: str = "<u2"):
        self.__array_interface__ = {"shape": shape, "typestr": typestr, "data": (address, False), "version": 3}
        self._owner = owner


def _contiguous(array):
    """`array` itself where it is a C-contiguous numpy, torch or cupy array, else a contiguous copy of it
    (anything else as given: the module names what it cannot take)."""
    if _is_torch(array):
        # torch calls a tensor contiguous whatever the strides of its dimensions of one or no elements, but
        # views its bytes (_bytes) only where the last stride is 1: such a tensor gets fresh strides here.
        if array.is_contiguous() and (array.dim() == 0 or array.stride(-1) == 1):
            return array
        return _torch().empty(array.shape, dtype=array.dtype, device=array.device).copy_(array)
    flags = getattr(array, "flags", None)
    if flags is None or flags.c_contiguous:
        return array
    return _cupy().ascontiguousarray(array) if type(array).__module__.startswith("cupy") \
        else np.ascontiguousarray(array)


def _fp8_dtype(config) -> str:
    """torch's name of a group's fp8 encoding: float8_e4m3fn or float8_e4m3fnuz."""
    return "float8_" + str(config.fp8_encoding).split(".")[-1].lower()


def _typed(array, dtype: str, config):
    """uint8 `array` viewed as `dtype` (torch's name; "fp8" the encoding of `config`, a group's), its last
    dimension in that type's items: a torch array as named (uint8 where this torch lacks the type); numpy and
    cupy arrays bf16 as uint16 bits, float32 as it is, the rest as the bytes."""
    if dtype == "fp8":
        dtype = _fp8_dtype(config)
    if _is_torch(array):
        return array.view(getattr(_torch(), dtype, _torch().uint8))
    return array.view({"bfloat16": np.uint16, "float32": np.float32}.get(dtype, np.uint8))


def _bytes(array):
    """A contiguous array's bytes: a uint8 view, its last dimension times the item size."""
    return array.view(_torch().uint8 if _is_torch(array) else np.uint8)


def _writable(array) -> bool:
    """False for a read-only numpy array; torch and cupy arrays are writable."""
    flags = getattr(array, "flags", None)
    return getattr(flags, "writeable", True)


def _is_torch(array) -> bool:
    return type(array).__module__.startswith("torch")


def _cupy():
    import cupy

    return cupy


def _to_host(array):
    """A numpy array of `array`'s values: torch's and cupy's copied to the host, numpy's as they are."""
    if _is_torch(array):
        return array.cpu().numpy()
    return array.get() if type(array).__module__.startswith("cupy") else array


class Group:
    """An expert-parallel group over a bootstrap (see rocep.bootstrap), in the layout of
    `layout` (default: the per-token layout, which the servers' fused-MoE kernels read; it replaces
    config.layout). `arrays` names the GPU backend's array library ("torch" or "cupy"; None: torch if
    installed, else cupy). Collective."""

    def __init__(self, bootstrap, config: "_rocep.EpConfig", backend=_rocep.Backend.AUTO,
                 layout=_rocep.Layout.PER_TOKEN, arrays=None):
        if arrays is not None and arrays not in _GPU_ARRAYS:  # before the collective creation, on every rank
            raise _rocep.ConfigError(
                f"arrays = {arrays!r} is invalid: allowed are None, {', '.join(map(repr, _GPU_ARRAYS))}")
        config = _rocep.EpConfig(config)  # the caller's stays as it is
        config.layout = layout
        self._group = _rocep.EpGroup(bootstrap, config, backend)
        self._bootstrap = bootstrap
        self._views = []  # weak references to the memory objects of the arrays made from its buffers
        self._closed = False
        self._config = self._group.config  # a copy: what the calls size and check the arrays by
        self._tag = _GroupTag(self._config)  # what its results name it by
        self.rank, self.world_size = self._group.rank, self._group.world_size
        self._gpu = self._group.backend == _rocep.Backend.GPU
        if not self._gpu and str(backend).split(".")[-1].lower() == "auto":
            _warn_of_a_build_without_gpu()
        self._arrays = _gpu_arrays(arrays) if self._gpu else "numpy"
        self._pending = None  # combine_send's arrays and result, until combine_recv
        self._tokens = 0  # the last dispatch's token count: the rows combine writes
        self._sent = None  # dispatch_send's converted inputs, until dispatch_recv

    def close(self) -> None:
        """Releases the group's memory now, rather than when the object goes (EpGroup::close). Collective:
        every rank calls it at the same point. Refused on every rank, nothing released, while any rank holds an
        array made from the group's input buffers (dispatch_input_buffer, combine_input_buffer: rocep.Error
        names those ranks; drop the arrays and call it again), or while another thread is inside a call of
        the group on any rank (rocep.CallOrderError naming those ranks). A watchdog's poll_error answers
        before the release or raises rocep.CallOrderError after it. Afterwards every call raises
        rocep.CallOrderError; close() again does nothing."""
        if self._closed:
            return
        alive = any(view() is not None for view in self._views)
        held = _gathered(self._bootstrap, bytes([alive]))  # a byte per rank, in rank order
        holding = [rank for rank, views in enumerate(held) if views]
        if holding:
            raise _rocep.Error(f"Group.close() on rank {self.rank}: refused on every rank, nothing released: "
                               f"arrays made from the group's input buffers are alive on rank(s) {holding}; "
                               "drop them, then call close() again")
        self._group.close()
        self._closed = True

    def __repr__(self) -> str:
        where = "closed" if self._closed else f"GPU {self._group.device}" if self._gpu else "CPU reference"
        return f"rocep.Group(rank {self.rank} of {self.world_size}, {where}, {self._config!r})"

    @property
    def config(self) -> "_rocep.EpConfig":
        """The group's configuration, with its layout: a copy (writing to it changes no group; the
        configuration is fixed at creation)."""
        return _rocep.EpConfig(self._config)

    @property
    def backend(self):
        return self._group.backend

    @property
    def device(self) -> int:
        """The GPU the group's memory and kernels are on (EpGroup::device: the current device when the group
        was created), -1 on the CPU reference. Its outputs are allocated there, its arrays must be there, and
        every call must come with it current (torch.cuda.set_device), else InvalidInputError."""
        return self._group.device

    @property
    def memory_bytes(self) -> int:
        """Bytes the group allocated for itself on its device, outputs not included (EpGroup::memory_bytes:
        its regions and bookkeeping, across nodes its symmetric memory; 0 on the CPU reference)."""
        return self._group.memory_bytes

    def _empty(self, shape, dtype: str):
        """An output array of the group's library; bf16 as uint16 bits where the library has no bfloat16."""
        if self._arrays == "torch":
            torch = _torch()
            # torch's uint32 tensors support few operations: offsets come as int32 (the same bits).
            return torch.empty(shape, dtype=torch.int32 if dtype == "uint32" else getattr(torch, dtype),
                               device=torch.device("cuda", self._group.device))
        dtype = "uint16" if dtype == "bfloat16" else dtype
        if self._arrays != "cupy":
            return np.empty(shape, dtype=dtype)
        with _cupy().cuda.Device(self._group.device):
            return _cupy().empty(shape, dtype=dtype)

    def _own_memory(self, address: int, rows: int, row_bytes: int = 0):
        """`rows` rows at `address`, the group's own memory, as an array of its library: a view, valid while
        the group lives. bf16 rows of hidden (torch bfloat16, else the bf16 bits as uint16), or with
        `row_bytes`, uint8 rows of that many bytes."""
        shape = (rows, row_bytes) if row_bytes else (rows, self._config.hidden)
        typestr = "|u1" if row_bytes else "<f2" if self._gpu and self._arrays == "torch" else "<u2"
        if self._gpu:
            memory = _DeviceMemory(address, shape, typestr, self)
        else:
            memory = _HostMemory(address, shape, self, typestr)
        self._views = [view for view in self._views if view() is not None] + [weakref.ref(memory)]
        if not self._gpu:
            return np.asarray(memory)
        if self._arrays != "torch":
            with _cupy().cuda.Device(self._group.device):
                return _cupy().asarray(memory)
        tensor = _torch().as_tensor(memory, device=_torch().device("cuda", self._group.device))
        return tensor if row_bytes else tensor.view(_torch().bfloat16)

    def dispatch_input_buffer(self):
        """This rank's input buffer in the group's own memory, where the peers read its tokens. bf16 groups:
        [max_tokens_per_rank, hidden] bf16. Scaled formats: [max_tokens_per_rank, format_input_row_bytes]
        uint8, each row a token already quantised: its payload (format_payload_bytes bytes), then its scales
        row-major (format_scale_bytes bytes, as token_scales holds them), then padding. Tokens written there
        and passed to dispatch as its first rows (`buffer[:num_tokens]`, with no token_scales) are not copied
        by the send. Write it only between this rank's combine and its next dispatch, in stream order."""
        config = self._config
        scaled = config.dispatch_format != _rocep.TokenFormat.BF16
        return self._own_memory(self._group.dispatch_input_buffer_address(), config.max_tokens_per_rank,
                                _rocep.format_input_row_bytes(config.dispatch_format, config.hidden) if scaled
                                else 0)

    def combine_input_buffer(self):
        """Per-token layout with a bf16 combine only: [max_recv_tokens, hidden] bf16 in the group's own memory,
        for the expert outputs (a row per received token, at its row). Passed to combine as expert_outputs
        (the whole buffer), its rows are not copied: the peers of the node load them from there, and peers on
        other nodes get them put from there (docs/scale-out.md). Write it only between this rank's dispatch
        and its combine, in stream order. Raises rocep.ConfigError for the expanded layout, an fp8 combine
        and a group whose EpConfig.combine_input_buffer is False."""
        return self._own_memory(self._group.combine_input_buffer_address(),
                                self._config.max_recv_tokens(self.world_size))

    def _stream(self) -> int:
        if self._arrays == "torch":
            return _torch().cuda.current_stream().cuda_stream
        if self._arrays == "cupy":
            return _cupy().cuda.get_current_stream().ptr
        return 0

    def _outputs(self):
        """Fresh outputs of the group's layout, with their arrays converted for the module once."""
        result = self._allocate_outputs()
        if isinstance(result, ExpandedResult):
            result.native = _rocep.ExpandedOutputArrays(result.tokens, result.scales, result.row_offsets,
                                                        result.expert_ids, result.src_info, result.weights)
        else:
            result.native = _rocep.OutputArrays(result.tokens, result.scales, result.topk_ids, result.topk_weights,
                                                result.src_info, result.num_recv_tokens, result.sorted_token_ids,
                                                result.block_expert_ids, result.row_offsets)
        result.group = self._tag
        payload_type, scale_type, expanded_scales = _OUTPUT_TYPES[self._config.dispatch_format]
        result.tokens = _typed(result.tokens, payload_type, self._config)
        if scale_type is not None:
            scales, rows = _typed(result.scales, scale_type, self._config), result.tokens.shape[0]
            if isinstance(result, ExpandedResult) and expanded_scales != "tiles":
                scales = scales.reshape((-1, rows) if expanded_scales == "transposed" else (rows, -1))
            result.scales = scales
        return result

    def _allocate_outputs(self):
        config, world = self._config, self.world_size
        if config.layout == _rocep.Layout.EXPANDED:
            rows = config.max_recv_rows(world)
            payload = _rocep.format_payload_bytes(config.dispatch_format, config.hidden)
            scale_bytes = _rocep.format_scale_tensor_bytes(config.dispatch_format, rows, config.hidden)
            local = self._group.num_local_experts
            return ExpandedResult(
                tokens=self._empty((rows, payload), "uint8"),
                scales=self._empty((scale_bytes,), "uint8") if scale_bytes > 0 else None,
                row_offsets=self._empty((local + 1,), "uint32"),
                expert_ids=self._empty((local,), "int32"),
                src_info=self._empty((rows, 3), "int32"),
                weights=self._empty((rows,), "float32"),
            )
        rows, entries = config.max_recv_tokens(world), config.max_recv_rows(world)
        payload = _rocep.format_payload_bytes(config.dispatch_format, config.hidden)
        scale_bytes = _rocep.format_scale_bytes(config.dispatch_format, config.hidden)
        return DispatchResult(
            tokens=self._empty((rows, payload), "uint8"),
            scales=self._empty((rows, scale_bytes), "uint8") if scale_bytes > 0 else None,
            topk_ids=self._empty((rows, config.top_k), "int32"),
            topk_weights=self._empty((rows, config.top_k), "float32"),
            src_info=self._empty((rows, 3), "int32"),
            num_recv_tokens=self._empty((1,), "int32"),
            sorted_token_ids=self._empty((entries,), "int32"),
            block_expert_ids=self._empty((entries // config.expert_alignment,), "int32"),
            row_offsets=self._empty((self._group.num_local_experts + 1,), "uint32"),
        )

    def _inputs(self, tokens, topk_ids, topk_weights, token_scales):
        """(tokens, topk_ids, token_scales, error) as the module takes them: int64 ids as int32 (a copy);
        torch fp8 tokens and any scale type as their bytes, once their dtypes are checked against the
        group's dispatch_format. error names a bad argument (None when fine): one that is no array of two
        dimensions, more rows than max_tokens_per_rank, a bad dtype; the module checks the rest."""
        for name, array in (("tokens", tokens), ("topk_ids", topk_ids), ("topk_weights", topk_weights),
                            ("token_scales", token_scales)):
            if array is None and name == "token_scales":
                continue
            shape = getattr(array, "shape", None)
            if shape is None:
                return tokens, topk_ids, token_scales, (
                    f"{name}: must be an array (numpy, torch, cupy or any DLPack array), is "
                    f"{type(array).__name__}")
            if len(shape) != 2:
                return tokens, topk_ids, token_scales, (
                    f"{name}: must have 2 dimensions, has {len(shape)} (shape {tuple(shape)})")
        most = self._config.max_tokens_per_rank
        if topk_ids.shape[0] > most:
            return tokens, topk_ids, token_scales, (
                f"topk_ids: {topk_ids.shape[0]} rows (tokens), allowed are at most max_tokens_per_rank = {most}")
        if str(getattr(topk_ids, "dtype", "")) in ("int64", "torch.int64"):
            # Ids past int32 become num_experts, an invalid id (its slot dropped and reported), not a wrap.
            experts = self._config.num_experts
            if _is_torch(topk_ids):
                topk_ids = topk_ids.masked_fill((topk_ids < -1) | (topk_ids >= experts), experts).int()
            else:
                topk_ids = np.where((topk_ids < -1) | (topk_ids >= experts), experts, topk_ids).astype(np.int32)
        if token_scales is None:
            return tokens, topk_ids, None, None
        format_ = self._config.dispatch_format
        token_dtype = str(getattr(tokens, "dtype", "")).replace("torch.", "")
        allowed_tokens = _PAYLOAD_DTYPES.get(format_, ("uint8",))
        if format_ == _rocep.TokenFormat.FP8_BLOCK128:
            fnuz = token_dtype == "float8_e4m3fnuz"
            encoding = _rocep.Fp8Encoding.E4M3FNUZ if fnuz else _rocep.Fp8Encoding.E4M3FN
            if token_dtype.startswith("float8") and self._config.fp8_encoding != encoding:
                allowed_tokens = ("uint8", _fp8_dtype(self._config))
        scale_dtype = str(getattr(token_scales, "dtype", "")).replace("torch.", "")
        allowed_scales = _SCALE_DTYPES.get(format_, ())
        if scale_dtype not in allowed_scales:
            return tokens, topk_ids, token_scales, (
                f"token_scales: dtype {scale_dtype} is invalid for dispatch_format {format_}: allowed are "
                f"{', '.join(allowed_scales) or 'none (bf16 carries no scales)'}")
        if token_dtype not in allowed_tokens:
            return tokens, topk_ids, token_scales, (
                f"tokens: dtype {token_dtype} is invalid for pre-quantised tokens of dispatch_format "
                f"{format_}: allowed are {', '.join(allowed_tokens)}")
        # The shape in the scales' own elements (the module checks their bytes).
        item_bytes = 4 if scale_dtype == "float32" else 1
        scale_shape = (len(topk_ids), _rocep.format_scale_bytes(format_, self._config.hidden) // item_bytes)
        if tuple(getattr(token_scales, "shape", ())) != scale_shape:
            return tokens, topk_ids, token_scales, (
                f"token_scales: shape must be {scale_shape} ({scale_dtype}), is "
                f"{tuple(getattr(token_scales, 'shape', ()))}")
        return _bytes(_contiguous(tokens)), topk_ids, _bytes(_contiguous(token_scales)), None

    def _no_tokens(self):
        """Inputs of zero tokens, for a rank that takes part in a dispatch whose inputs it refused."""
        hidden, top_k = self._config.hidden, self._config.top_k
        tokens = self._empty((0, hidden), "bfloat16")
        return tokens, self._empty((0, top_k), "int32"), self._empty((0, top_k), "float32"), None, None

    def _checked(self, tokens, topk_ids, topk_weights, token_scales, global_scale, out):
        """The module's inputs (tokens, topk_ids, topk_weights, token_scales, global_scale) and outputs for a
        dispatch, and the error to raise after taking part (None when the arguments are fine): a bad
        argument makes this rank take part with zero tokens."""
        tokens, topk_ids, token_scales, error = self._inputs(tokens, topk_ids, topk_weights, token_scales)
        if out is not None and getattr(out, "group", None) is not self._tag:
            error, out = error or "out: must be a result of an earlier dispatch of this group", None
        result = self._outputs() if out is None else out
        if error:
            return self._no_tokens(), result, \
                f"dispatch on rank {self.rank}: {error} (this rank took part with zero tokens)"
        # Contiguous copies made here, not by the module: the caller's split send keeps them alive (_sent)
        # until its receive, where the kernels may still read them.
        inputs = tuple(None if array is None else _contiguous(array)
                       for array in (tokens, topk_ids, topk_weights, token_scales, global_scale))
        return inputs, result, None

    def dispatch(self, tokens, topk_ids, topk_weights, token_scales=None, out=None, *,
                 expert_input_scales=None, global_scale=None) -> DispatchResult:
        """Sends every token to the ranks of its experts; returns this rank's received tokens. Collective.
        tokens: bf16 [T, hidden]; or, pre-quantised, the payload [T, payload bytes] (uint8, or torch's fp8
        dtype of an fp8 format) with token_scales [T, scales] (float32 for fp8 block-128, e8m0 or uint8 for
        MX formats, e4m3fn or uint8 for nvfp4); topk_ids int32 or int64 [T, top_k]; topk_weights float32
        [T, top_k]. out: a result of an earlier dispatch of this group to write into instead of allocating
        (its contents are replaced). expert_input_scales: expanded layout with bf16 dispatch only, float32
        [L]: the receiving rank quantises each row to fp8 with its expert's scale (ExpandedResult.
        input_scaled_tokens gives the codes). global_scale: nvfp4 groups given bf16 tokens only, float32
        [1] on the group's device, the same on every rank: the global scale the tokens are quantised with.
        Bad arguments raise rocep.InvalidInputError after this rank took part with zero tokens, so that its
        peers complete."""
        inputs, result, error = self._checked(tokens, topk_ids, topk_weights, token_scales, global_scale, out)
        self._took_part(self._group.dispatch, inputs, result.native, expert_input_scales, self._stream())
        if error:
            raise _issued(error)
        return result

    def _took_part(self, call, inputs, *arguments):
        """Runs the module's dispatch or dispatch_send and records the rows the next combine writes: the
        inputs' tokens, none where the module took part with zero tokens (InvalidInputError, issued), and the
        last dispatch's where the call was refused before anything was issued (CallOrderError, or
        InvalidInputError not issued: another GPU current than the group's)."""
        try:
            call(*inputs, *arguments)
        except _rocep.InvalidInputError as error:
            if error.issued:
                self._tokens = 0
            raise
        self._tokens = len(inputs[1])

    def dispatch_send(self, tokens, topk_ids, topk_weights, token_scales=None, *, global_scale=None) -> None:
        """The send half of dispatch: returns once issued; the inputs must stay alive until dispatch_recv."""
        inputs, _, error = self._checked(tokens, topk_ids, topk_weights, token_scales, global_scale, None)
        try:
            self._took_part(self._group.dispatch_send, inputs, self._stream())
        except _rocep.InvalidInputError as refused:  # issued with zero tokens, unless refused before
            if refused.issued:
                self._sent = inputs
            raise
        self._sent = inputs  # kept alive until dispatch_recv
        if error:
            raise _issued(error)

    def dispatch_recv(self, out=None, *, expert_input_scales=None) -> DispatchResult:
        """The receive half of dispatch: waits for every peer's send and returns this rank's tokens (into
        out, and with expert_input_scales, as for dispatch)."""
        bad_out = out is not None and getattr(out, "group", None) is not self._tag
        result = self._outputs() if out is None or bad_out else out
        self._group.dispatch_recv(result.native, expert_input_scales, self._stream())
        self._sent = None
        if bad_out:
            raise _issued("out: must be a result of an earlier dispatch of this group (the receive went "
                          "ahead into outputs of its own)")
        return result

    def _combine_arguments(self, expert_outputs, num_tokens, shared_expert_output, row_weights, out,
                           epilogue=(1.0, None, None)):
        """The call's arrays and the result to return, and the error to raise after taking part. The rows
        combine writes are the last dispatch's tokens, whatever num_tokens says: a wrong num_tokens or a
        short `out` is written to a buffer of the group's of the right size (the caller's out untouched, the
        shared expert and epilogue left out), then raised as InvalidInputError."""
        tokens, error = self._tokens, None
        if num_tokens != tokens:
            error = (f"num_tokens = {num_tokens} is invalid: this rank's last dispatch had {tokens} tokens "
                     "(the combine went ahead for those into a buffer of its own)")
            out = None
        unreduced = self._config.layout == _rocep.Layout.EXPANDED and row_weights is None
        row_shape = ((self._config.top_k,) if unreduced else ()) + (self._config.hidden,)
        if out is not None and (getattr(out, "shape", None) is None or not _writable(out)):
            error = error or (f"out: must be a writable array (numpy, torch or cupy), is {type(out).__name__}"
                              f"{'' if getattr(out, 'shape', None) is None else ' (read-only)'} (the combine "
                              "went ahead into a buffer of its own)")
            out = None
        if out is not None and (tuple(out.shape[1:]) != row_shape or out.shape[0] < tokens):
            error = error or (f"out: shape must be ({tokens} or more, {', '.join(map(str, row_shape))}), "
                              f"is {tuple(out.shape)} (the combine went ahead into a buffer of its own)")
            out = None
        if out is None:  # a row even for no tokens: the call needs a buffer
            out = self._empty((max(tokens, 1),) + row_shape, "bfloat16")
        factor, token_factors, residual = epilogue
        if tokens == 0 or num_tokens != tokens:  # of no tokens, or sized for a count that is not the call's
            shared_expert_output = token_factors = residual = None
        # Contiguous inputs made here (see _checked): combine_send's _pending keeps them until combine_recv.
        expert_outputs, row_weights, shared_expert_output, token_factors, residual = (
            None if array is None else _contiguous(array)
            for array in (expert_outputs, row_weights, shared_expert_output, token_factors, residual))
        return (expert_outputs, row_weights, shared_expert_output, out[:max(tokens, 1)], float(factor),
                token_factors, residual), out[:tokens], error

    def combine(self, expert_outputs, num_tokens: int, shared_expert_output=None, row_weights=None, out=None, *,
                factor: float = 1.0, token_factors=None, residual=None):
        """Returns this rank's tokens (bf16 bits on the CPU reference). Per-token layout: expert_outputs
        [P, hidden], one row per received token, weights applied; out [num_tokens, hidden], the rows of every
        rank that received each token summed in ascending rank order in float32 (+ the shared expert),
        rounded once. Expanded layout: expert_outputs [R, hidden], one per dispatched row; with row_weights
        [R] (normally the dispatch's weights) the weighted sum [num_tokens, hidden], without them every
        slot's row [num_tokens, top_k, hidden]. num_tokens is the last dispatch's token count. out: an
        array of at least num_tokens rows to write into instead of allocating; the result is its first
        num_tokens rows. A reduced combine's out may be a slice of a wider tensor (rows any multiple of 8
        elements apart, each row contiguous), and its epilogue applies to each summed float32 value v of
        token t before the bf16 store: v * factor (unless 1), then * token_factors[t] (float32 [num_tokens]),
        then + residual[t] (bf16 [num_tokens, hidden]), each rounded on its own. Collective."""
        arguments, result, error = self._combine_arguments(expert_outputs, num_tokens, shared_expert_output,
                                                           row_weights, out, (factor, token_factors, residual))
        self._group.combine(*arguments, self._stream())
        if error:
            raise _issued(error)
        return result

    def combine_send(self, expert_outputs, num_tokens: int, shared_expert_output=None, row_weights=None,
                     out=None, *, factor: float = 1.0, token_factors=None, residual=None) -> None:
        """The send half of combine (same arguments); combine_recv returns the tokens. The arrays must stay
        alive until then."""
        arguments, result, error = self._combine_arguments(expert_outputs, num_tokens, shared_expert_output,
                                                           row_weights, out, (factor, token_factors, residual))
        self._group.combine_send(*arguments, self._stream())  # raises only before anything is issued
        self._pending = (arguments, result)
        if error:
            raise _issued(error)

    def combine_recv(self):
        """The receive half of combine: waits for every peer's rows and returns this rank's tokens."""
        if self._pending is None:
            raise _rocep.CallOrderError("combine_recv: no combine_send before it on this rank")
        arguments, result = self._pending
        self._group.combine_recv(*arguments, self._stream())  # refused: the send stays pending, to repeat
        self._pending = None
        return result

    def synchronize(self) -> None:
        """Waits for the group's stream and raises what the kernels recorded (rocep.Error subclasses)."""
        self._group.synchronize(self._stream())

    def poll_error(self) -> RecordedError:
        """What the kernels recorded so far, without waiting: a RecordedError, false where nothing was
        (`if error := group.poll_error(): log(error.message)`). Any thread may call it at any time, also while
        another thread is inside a call of the group, with the group's GPU current
        (torch.cuda.set_device(self.device) once in that thread)."""
        return RecordedError(*self._group.poll_error())
