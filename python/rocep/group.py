"""The native API on arrays: a group that allocates its outputs, in either layout (EpConfig.layout).

On the CPU reference the arrays are numpy arrays (bf16 as uint16 bits); on the GPU backend, torch tensors
on the current device, and calls go on the current torch stream.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _rocep


@dataclass
class DispatchResult:
    """What dispatch wrote on this rank (the per-token layout of include/rocep/types.hpp)."""

    tokens: Any  # [P, payload bytes] uint8 (bf16: view as [P, hidden] uint16 / bfloat16)
    scales: Any  # [P, scale bytes] uint8, or None for bf16
    topk_ids: Any  # [P, top_k] int32: local expert, -1 elsewhere
    topk_weights: Any  # [P, top_k] float32
    src_info: Any  # [P, 3] int32: source rank, source token, -1
    num_recv_tokens: Any  # [1] int32: the rows below it are this call's
    sorted_token_ids: Any  # [R] int32
    block_expert_ids: Any  # [R / expert_alignment] int32
    row_offsets: Any  # [L + 1] uint32: row_offsets[L] = num_tokens_post_padded

    def count(self) -> int:
        return int(np.asarray(_to_host(self.num_recv_tokens))[0])


@dataclass
class ExpandedResult:
    """What dispatch wrote on this rank in the expanded layout: a row per (token, local expert), expert by
    expert (include/rocep/types.hpp)."""

    tokens: Any  # [R, payload bytes] uint8
    scales: Any  # the scale tensor (formats.hpp layouts) as uint8 bytes, or None for bf16
    row_offsets: Any  # [L + 1] uint32: expert e's rows are [row_offsets[e], row_offsets[e + 1])
    expert_ids: Any  # [L] int32
    src_info: Any  # [R, 3] int32: source rank, source token, k
    weights: Any  # [R] float32: the router weight of the row's (token, expert) pair

    def count(self) -> int:
        return int(np.asarray(_to_host(self.row_offsets))[-1])


def _to_host(array):
    return array.cpu().numpy() if hasattr(array, "cpu") else array


class Group:
    """An expert-parallel group over a bootstrap (see rocep.bootstrap), in the layout of
    `layout` (default: the per-token layout, which the servers' fused-MoE kernels read). Collective."""

    def __init__(self, bootstrap, config: "_rocep.EpConfig", backend=_rocep.Backend.AUTO,
                 layout=_rocep.Layout.PER_TOKEN):
        config = _rocep.EpConfig(config)  # the caller's stays as it is
        config.layout = layout
        self._group = _rocep.EpGroup(bootstrap, config, backend)
        self.config = self._group.config
        self.rank, self.world_size = self._group.rank, self._group.world_size
        self._gpu = self._group.backend == _rocep.Backend.GPU
        self._pending = None  # combine_send's arrays, until combine_recv
        self._sent = None  # dispatch_send's converted inputs, until dispatch_recv

    @property
    def backend(self):
        return self._group.backend

    def _empty(self, shape, dtype: str):
        if self._gpu:
            import torch

            return torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")
        return np.empty(shape, dtype=dtype)

    def _stream(self) -> int:
        if self._gpu:
            import torch

            return torch.cuda.current_stream().cuda_stream
        return 0

    def _outputs(self):
        config, world = self.config, self.world_size
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

    @staticmethod
    def _arrays(result):
        if isinstance(result, ExpandedResult):
            return _rocep.ExpandedOutputArrays(result.tokens, result.scales, result.row_offsets, result.expert_ids,
                                               result.src_info, result.weights)
        return _rocep.OutputArrays(result.tokens, result.scales, result.topk_ids, result.topk_weights,
                                   result.src_info, result.num_recv_tokens, result.sorted_token_ids,
                                   result.block_expert_ids, result.row_offsets)

    def _inputs(self, tokens, topk_ids):
        """int64 ids as int32 (a copy); torch fp8 tokens as their bytes, their encoding checked against the
        config's. Anything else goes to the checks of the module as it is."""
        if str(getattr(topk_ids, "dtype", "")) in ("int64", "torch.int64"):
            topk_ids = topk_ids.astype(np.int32) if isinstance(topk_ids, np.ndarray) else topk_ids.int()
        dtype = str(getattr(tokens, "dtype", ""))
        if dtype.startswith("torch.float8"):
            encoding = {"torch.float8_e4m3fn": _rocep.Fp8Encoding.E4M3FN,
                        "torch.float8_e4m3fnuz": _rocep.Fp8Encoding.E4M3FNUZ}.get(dtype)
            if self.config.dispatch_format != _rocep.TokenFormat.FP8_BLOCK128 or encoding is None or \
                    self.config.fp8_encoding not in (_rocep.Fp8Encoding.AUTO, encoding):
                raise _rocep.InvalidInputError(
                    f"tokens: dtype {dtype} does not match the group's dispatch_format "
                    f"{self.config.dispatch_format} / fp8_encoding {self.config.fp8_encoding}")
            import torch

            tokens = tokens.view(torch.uint8)
        return tokens, topk_ids

    def dispatch(self, tokens, topk_ids, topk_weights, token_scales=None) -> DispatchResult:
        """Sends every token to the ranks of its experts; returns this rank's received tokens. Collective.
        tokens: bf16 [T, hidden], or the payload bytes [T, payload] with token_scales for pre-quantised
        tokens; topk_ids int32 or int64 [T, top_k]; topk_weights float32 [T, top_k]. Bad inputs raise
        rocep.InvalidInputError after this rank took part with zero tokens."""
        tokens, topk_ids = self._inputs(tokens, topk_ids)
        result = self._outputs()
        self._group.dispatch(tokens, topk_ids, topk_weights, token_scales, self._arrays(result), self._stream())
        return result

    def dispatch_send(self, tokens, topk_ids, topk_weights, token_scales=None) -> None:
        """The send half of dispatch: returns once issued; the inputs must stay alive until dispatch_recv."""
        tokens, topk_ids = self._inputs(tokens, topk_ids)
        self._sent = (tokens, topk_ids)  # kept alive until dispatch_recv
        self._group.dispatch_send(tokens, topk_ids, topk_weights, token_scales, self._stream())

    def dispatch_recv(self) -> DispatchResult:
        """The receive half of dispatch: waits for every peer's send and returns this rank's tokens."""
        result = self._outputs()
        self._group.dispatch_recv(self._arrays(result), self._stream())
        self._sent = None
        return result

    def _combine_arguments(self, expert_outputs, num_tokens, shared_expert_output, row_weights):
        # `out` gets a row even for no tokens (the call needs a buffer); a shared expert of no tokens adds nothing.
        unreduced = self.config.layout == _rocep.Layout.EXPANDED and row_weights is None
        shape = (max(num_tokens, 1),) + ((self.config.top_k,) if unreduced else ()) + (self.config.hidden,)
        out = self._empty(shape, "bfloat16" if self._gpu else "uint16")
        shared = shared_expert_output if num_tokens > 0 else None
        return expert_outputs, row_weights, shared, out[:max(num_tokens, 1)], out[:num_tokens]

    def combine(self, expert_outputs, num_tokens: int, shared_expert_output=None, row_weights=None):
        """Returns this rank's tokens (bf16 bits on the CPU reference). Per-token layout: expert_outputs
        [P, hidden], one row per received token, weights applied; out [num_tokens, hidden], the rows of every
        rank that received each token summed in ascending rank order in float32 (+ the shared expert),
        rounded once. Expanded layout: expert_outputs [R, hidden], one per dispatched row; with row_weights
        [R] (normally the dispatch's weights) the weighted sum [num_tokens, hidden], without them every
        slot's row [num_tokens, top_k, hidden]. Collective."""
        rows, weights, shared, out, result = self._combine_arguments(expert_outputs, num_tokens,
                                                                     shared_expert_output, row_weights)
        self._group.combine(rows, weights, shared, out, self._stream())
        return result

    def combine_send(self, expert_outputs, num_tokens: int, shared_expert_output=None, row_weights=None) -> None:
        """The send half of combine; combine_recv returns the tokens. The arrays must stay alive until then."""
        self._pending = self._combine_arguments(expert_outputs, num_tokens, shared_expert_output, row_weights)
        self._group.combine_send(*self._pending[:4], self._stream())

    def combine_recv(self):
        """The receive half of combine: waits for every peer's rows and returns this rank's tokens."""
        if self._pending is None:
            raise _rocep.CallOrderError("combine_recv: no combine_send before it on this rank")
        rows, weights, shared, out, result = self._pending
        self._pending = None
        self._group.combine_recv(rows, weights, shared, out, self._stream())
        return result

    def synchronize(self) -> None:
        """Waits for the group's stream and raises what the kernels recorded (rocep.Error subclasses)."""
        self._group.synchronize(self._stream())

    def poll_error(self):
        """(kind, message) recorded so far, without waiting: kind 0 = none, 1 = invalid input, 2 = timeout."""
        return self._group.poll_error()
