"""The native API on arrays: a per-token group that allocates its outputs.

On the CPU reference the arrays are numpy arrays (bf16 as uint16 bits); on the GPU backend, torch tensors
on the current device, and calls go on the current torch stream.
"""

from dataclasses import dataclass
from typing import Any, Optional

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


def _to_host(array):
    return array.cpu().numpy() if hasattr(array, "cpu") else array


class Group:
    """A per-token expert-parallel group over a bootstrap (see rocep.bootstrap). Collective to create."""

    def __init__(self, bootstrap, config: "_rocep.EpConfig", backend=_rocep.Backend.AUTO):
        config = _rocep.EpConfig(config)  # the caller's stays as it is
        config.layout = _rocep.Layout.PER_TOKEN
        self._group = _rocep.EpGroup(bootstrap, config, backend)
        self.config = self._group.config
        self.rank, self.world_size = self._group.rank, self._group.world_size
        self._gpu = self._group.backend == _rocep.Backend.GPU
        self._last: Optional[DispatchResult] = None

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

    def dispatch(self, tokens, topk_ids, topk_weights, token_scales=None) -> DispatchResult:
        """Sends every token to the ranks of its experts; returns this rank's received tokens. Collective."""
        config, world = self.config, self.world_size
        rows, entries = config.max_recv_tokens(world), config.max_recv_rows(world)
        payload = _rocep.format_payload_bytes(config.dispatch_format, config.hidden)
        scale_bytes = _rocep.format_scale_bytes(config.dispatch_format, config.hidden)
        result = DispatchResult(
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
        self._group.dispatch(tokens, topk_ids, topk_weights, token_scales, result.tokens, result.scales,
                             result.topk_ids, result.topk_weights, result.src_info, result.num_recv_tokens,
                             result.sorted_token_ids, result.block_expert_ids, result.row_offsets,
                             self._stream())
        self._last = result
        return result

    def combine(self, expert_outputs, num_tokens: int, shared_expert_output=None):
        """Returns this rank's tokens [num_tokens, hidden] (bf16 bits on the CPU reference): the rows of
        every rank that received each token, summed in ascending rank order in float32 (+ the shared
        expert), rounded once. `expert_outputs` is [P, hidden], one row per received token. Collective."""
        out = self._empty((max(num_tokens, 1), self.config.hidden), "uint16" if not self._gpu else "bfloat16")
        self._group.combine(expert_outputs, shared_expert_output, out[:max(num_tokens, 1)], self._stream())
        return out[:num_tokens]

    def synchronize(self) -> None:
        """Waits for the group's stream and raises what the kernels recorded (rocep.Error subclasses)."""
        self._group.synchronize(self._stream())

    def poll_error(self):
        """(kind, message) recorded so far, without waiting: kind 0 = none, 1 = invalid input, 2 = timeout."""
        return self._group.poll_error()
