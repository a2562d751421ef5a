"""A MoRI-shaped op over rocep's per-token layout, for servers written against MoRI's EpDispatchCombineOp.

Names, argument order and return tuples follow MoRI's documented Python API:

    config = rocep.mori.EpDispatchCombineConfig(data_type=..., rank=..., world_size=..., hidden_dim=...,
                                                scale_dim=..., scale_type_size=..., max_token_type_size=...,
                                                max_num_inp_token_per_rank=..., num_experts_per_rank=...,
                                                num_experts_per_token=..., gpu_per_node=...)
    op = rocep.mori.EpDispatchCombineOp(config, bootstrap)
    out, out_weights, out_scales, out_indices, recv_num_token = op.dispatch(input, weights, scales, indices)
    combined, combined_weights = op.combine(expert_output, weights, indices)

Differences, by design: the group is created over a rocep bootstrap (rocep.bootstrap), not MoRI's shmem
init; out_indices hold the global ids of this rank's experts and -1 for the slots of other ranks (which a
server's expert map sends to -1 anyway); combine sums one row per received token over the ranks in
ascending rank order in float32 (weights already applied by the caller), and returns the weights of this
rank's own tokens as given to dispatch. An op is not reentrant: one dispatch, then its combine. For two
micro-batches in flight (two-batch overlap), create one op per micro-batch.
"""

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _rocep
from .group import Group, _torch


_FP8_ENCODINGS = {"torch.float8_e4m3fn": _rocep.Fp8Encoding.E4M3FN,
                  "torch.float8_e4m3fnuz": _rocep.Fp8Encoding.E4M3FNUZ}


@dataclass
class EpDispatchCombineConfig:
    data_type: Any  # bf16 (torch.bfloat16, numpy.uint16), or torch.float8_e4m3fn / float8_e4m3fnuz
    rank: int
    world_size: int
    hidden_dim: int
    scale_dim: int
    scale_type_size: int
    max_token_type_size: int
    max_num_inp_token_per_rank: int
    num_experts_per_rank: int
    num_experts_per_token: int
    gpu_per_node: int = 0  # ranks per node; 0 = detect


class EpDispatchCombineOp:
    def __init__(self, config: EpDispatchCombineConfig, bootstrap, backend=_rocep.Backend.AUTO):
        ep = _rocep.EpConfig()
        fp8 = _FP8_ENCODINGS.get(str(config.data_type))
        if fp8 is None:
            if config.scale_dim != 0:
                raise _rocep.ConfigError(
                    f"EpDispatchCombineConfig.scale_dim = {config.scale_dim} is invalid for data_type "
                    f"{config.data_type}: allowed is 0 (bf16 tokens carry no scales)")
        else:
            block_scales = config.hidden_dim // 128
            if config.hidden_dim % 128 != 0 or config.scale_dim != block_scales or config.scale_type_size != 4:
                raise _rocep.ConfigError(
                    f"EpDispatchCombineConfig: scale_dim = {config.scale_dim}, scale_type_size = "
                    f"{config.scale_type_size} are invalid for data_type {config.data_type}: allowed are "
                    f"scale_dim = hidden_dim / 128 = {config.hidden_dim / 128:g} and scale_type_size = 4 "
                    "(float32 block-128 scales)")
            ep.dispatch_format, ep.fp8_encoding = _rocep.TokenFormat.FP8_BLOCK128, fp8
        ep.hidden = config.hidden_dim
        ep.top_k = config.num_experts_per_token
        ep.num_experts = config.num_experts_per_rank * config.world_size
        ep.max_tokens_per_rank = config.max_num_inp_token_per_rank
        ep.gpus_per_node = config.gpu_per_node
        self.config = config
        self._group = Group(bootstrap, ep, backend)
        if self._group.rank != config.rank or self._group.world_size != config.world_size:
            raise _rocep.ConfigError(
                f"EpDispatchCombineConfig: rank = {config.rank}, world_size = {config.world_size}, but the "
                f"bootstrap says rank {self._group.rank} of {self._group.world_size}")
        self._weights = None
        self._received = None  # dispatch's outputs, reused by every call (as MoRI's live in its buffers)
        self._combined = None  # combine's output rows [max_num_inp_token_per_rank, hidden], reused alike

    def dispatch(self, input, weights, scales, indices, **unused):
        """Returns (out, out_weights, out_scales, out_indices, recv_num_token): out [P, hidden], the rows
        below recv_num_token[0] valid, in (source rank, source token) order. The outputs live in the op's
        buffers until its next dispatch, as MoRI's do."""
        result = self._received = self._group.dispatch(input, indices, weights, scales, out=self._received)
        self._weights = weights
        out_scales = result.scales
        if isinstance(result.tokens, np.ndarray):
            out = result.tokens.view(np.uint16)
        else:
            torch = _torch()
            fp8 = str(self.config.data_type) in _FP8_ENCODINGS
            out = result.tokens.view(self.config.data_type if fp8 else torch.bfloat16)
            out_scales = out_scales.view(torch.float32) if fp8 else None
        first_expert = self._group.rank * self.config.num_experts_per_rank
        local = result.topk_ids
        where = np.where if isinstance(local, np.ndarray) else _torch().where  # no host sync: graph-safe
        out_indices = where(local >= 0, local + first_expert, -1)
        return out, result.topk_weights, out_scales, out_indices, result.num_recv_tokens

    def combine(self, input, weights, indices, **unused):
        """Returns (out, out_weights): this rank's tokens [num_tokens, hidden] and their weights. out lives in
        the op's buffer until its next combine."""
        num_tokens = self._weights.shape[0] if self._weights is not None else 0
        if self._combined is None:
            rows = max(self.config.max_num_inp_token_per_rank, 1)
            self._combined = self._group._empty((rows, self.config.hidden_dim),
                                                "bfloat16" if self._group.backend == _rocep.Backend.GPU else "uint16")
        out = self._group.combine(input, num_tokens, out=self._combined)
        weights_out, self._weights = self._weights, None
        return out, weights_out

    def reset(self) -> None:
        """Nothing to reset: rocep's calls need no host work between them. Kept for MoRI's call sequence."""
