"""A MoRI-shaped op over rocep's per-token layout, for servers written against MoRI's EpDispatchCombineOp.

Names, argument order and return tuples follow MoRI's documented Python API:

    config = rocep.EpDispatchCombineConfig(data_type=..., rank=..., world_size=..., hidden_dim=...,
                                           scale_dim=..., scale_type_size=..., max_token_type_size=...,
                                           max_num_inp_token_per_rank=..., num_experts_per_rank=...,
                                           num_experts_per_token=..., gpu_per_node=...)
    op = rocep.EpDispatchCombineOp(config, bootstrap)
    out, out_weights, out_scales, out_indices, recv_num_token = op.dispatch(input, weights, scales, indices)
    combined, combined_weights = op.combine(expert_output, weights, indices)
    # split: dispatch_send returns dispatch's tuple, valid once dispatch_recv() ran on the stream; the same
    # for combine_send / combine_recv
    counts = rocep.mori.local_expert_count(config, out_indices, recv_num_token)

Differences, by design: the group is created over a rocep bootstrap (rocep.bootstrap), not MoRI's shmem init;
out_indices hold the global ids of this rank's experts and -1 for the slots of other ranks (which a server's
expert map sends to -1 anyway); combine sums one row per received token over the ranks in ascending rank order
in float32 (weights already applied by the caller), and returns the weights of this rank's own tokens as given
to dispatch, combined having that many rows. MoRI's launch settings (in the config: block_num,
warp_num_per_block, rdma_block_num, kernel_type, use_external_inp_buf, num_qp_per_pe; per call in MoRI's
positions) are taken and ignored: rocep sizes its grids from EpConfig.num_sms. Beyond MoRI: poll_error and
synchronize report what the kernels recorded (an invalid expert id's slot dropped). Outputs live in the op's
buffers until its next call, as MoRI's do. An op is not reentrant: one dispatch, then its combine. For two
micro-batches in flight (two-batch overlap), create one op per micro-batch.
"""

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _rocep
from .bootstrap import gathered as _gathered
from .group import Group, RecordedError, _torch


_FP8_ENCODINGS = {"torch.float8_e4m3fn": _rocep.Fp8Encoding.E4M3FN,
                  "torch.float8_e4m3fnuz": _rocep.Fp8Encoding.E4M3FNUZ}
_DATA_TYPES = "torch.bfloat16, numpy.uint16 (bf16 bits), torch.float8_e4m3fn, torch.float8_e4m3fnuz"

# EpConfig's fields in the errors of the group's creation, as this config names them.
_CONFIG_NAMES = [(r"EpConfig\.hidden\b", "EpDispatchCombineConfig.hidden_dim"),
                 (r"EpConfig\.top_k\b", "EpDispatchCombineConfig.num_experts_per_token"),
                 (r"EpConfig\.num_experts\b", "EpDispatchCombineConfig.num_experts_per_rank x world_size"),
                 (r"EpConfig\.max_tokens_per_rank\b", "EpDispatchCombineConfig.max_num_inp_token_per_rank"),
                 (r"EpConfig\.gpus_per_node\b", "EpDispatchCombineConfig.gpu_per_node")]
# Group's arguments (where an error names one: "tokens: ...") and fields in its call errors, as the op names them.
_ARGUMENT_NAMES = {"tokens": "input", "topk_ids": "indices", "topk_weights": "weights", "token_scales": "scales",
                   "expert_outputs": "input", "max_tokens_per_rank": "max_num_inp_token_per_rank"}


def _renamed(error: "_rocep.InvalidInputError", note: str = "") -> "_rocep.InvalidInputError":
    """`error` with Group's names replaced by the op's (and `note` added), its `issued` kept."""
    message = re.sub(r"\b(tokens|topk_ids|topk_weights|token_scales|expert_outputs)(?=:)|\b(max_tokens_per_rank)\b",
                     lambda match: _ARGUMENT_NAMES[match.group(match.lastindex)], str(error))
    renamed = _rocep.InvalidInputError(message + note)
    renamed.issued = error.issued
    return renamed


def _is_bf16(data_type) -> bool:
    if str(data_type) == "torch.bfloat16":
        return True
    try:
        return np.dtype(data_type) == np.uint16
    except TypeError:
        return False


def _ep_config(config: "EpDispatchCombineConfig") -> "_rocep.EpConfig":
    """The EpConfig of the op's group; raises ConfigError naming the first field it cannot take."""
    ep = _rocep.EpConfig()
    fp8 = _FP8_ENCODINGS.get(str(config.data_type))
    if fp8 is not None:
        ep.dispatch_format, ep.fp8_encoding = _rocep.TokenFormat.FP8_BLOCK128, fp8
    for name, field in (("hidden_dim", "hidden"), ("num_experts_per_token", "top_k"),
                        ("max_num_inp_token_per_rank", "max_tokens_per_rank"), ("gpu_per_node", "gpus_per_node"),
                        ("num_experts_per_rank", "num_experts")):
        value = getattr(config, name)
        try:
            setattr(ep, field, value * config.world_size if field == "num_experts" else value)
        except TypeError:
            raise _rocep.ConfigError(f"EpDispatchCombineConfig.{name} = {value!r} is invalid: must be an int "
                                     "(a 32-bit one)") from None
    return ep


def _config_error(config: "EpDispatchCombineConfig", bootstrap) -> str:
    """What is wrong with `config` on this rank before a group is made of it ("" when nothing)."""
    if str(config.data_type) not in _FP8_ENCODINGS and not _is_bf16(config.data_type):
        return f"EpDispatchCombineConfig.data_type = {config.data_type} is invalid: allowed are {_DATA_TYPES}"
    if not isinstance(config.world_size, int):
        return f"EpDispatchCombineConfig.world_size = {config.world_size!r} is invalid: must be an int"
    try:
        _ep_config(config)
    except _rocep.ConfigError as error:
        return str(error)
    if config.rank != bootstrap.rank() or config.world_size != bootstrap.size():
        return (f"EpDispatchCombineConfig: rank = {config.rank}, world_size = {config.world_size}, but the "
                f"bootstrap says rank {bootstrap.rank()} of {bootstrap.size()}")
    if str(config.data_type) not in _FP8_ENCODINGS:
        if config.scale_dim != 0:
            return (f"EpDispatchCombineConfig.scale_dim = {config.scale_dim} is invalid for data_type "
                    f"{config.data_type}: allowed is 0 (bf16 tokens carry no scales)")
    elif config.hidden_dim % 128 != 0 or config.scale_dim != config.hidden_dim // 128 or config.scale_type_size != 4:
        return (f"EpDispatchCombineConfig: scale_dim = {config.scale_dim}, scale_type_size = "
                f"{config.scale_type_size} are invalid for data_type {config.data_type}: allowed are "
                f"scale_dim = hidden_dim / 128 = {config.hidden_dim / 128:g} and scale_type_size = 4 "
                "(float32 block-128 scales)")
    return ""


def _agree_on_configs(config: "EpDispatchCombineConfig", bootstrap) -> None:
    """Raises ConfigError on every rank if the config is wrong on any (each rank's first error gathered from
    all, so that no rank goes on to create a group its peers never join)."""
    size = 512
    try:  # whatever this rank finds goes into the all-gather: a rank that raised before it would hang its peers
        error = _config_error(config, bootstrap)
    except Exception as failure:  # a field of any type: reported to every rank, never raised alone
        error = f"EpDispatchCombineConfig: {type(failure).__name__}: {failure}"
    mine = error.encode()[:size].ljust(size, b"\0")
    gathered = _gathered(bootstrap, mine)
    for rank in range(bootstrap.size()):
        error = gathered[rank * size:(rank + 1) * size].rstrip(b"\0").decode(errors="replace")
        if error:
            raise _rocep.ConfigError(error if rank == bootstrap.rank() else f"rank {rank}: {error}")


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
    # MoRI's launch settings: accepted for drop-in use, not used (rocep's grids follow EpConfig.num_sms).
    warp_num_per_block: int = 8
    block_num: int = 80
    use_external_inp_buf: bool = True
    kernel_type: Any = None
    rdma_block_num: int = 0
    num_qp_per_pe: int = 1


def local_expert_count(config: EpDispatchCombineConfig, indices, total_recv_token_num, out=None):
    """Tokens routed to each of this rank's experts: int32 [num_experts_per_rank], counting the (row, slot)
    pairs of indices [P, top_k] (global ids, -1 elsewhere) in the rows below total_recv_token_num[0].
    MoRI's launch_local_expert_count, on arrays; on the GPU without a host synchronisation (graph-safe)."""
    experts, first = config.num_experts_per_rank, config.rank * config.num_experts_per_rank
    if isinstance(indices, np.ndarray):
        received = int(np.asarray(total_recv_token_num).reshape(-1)[0])
        valid = (np.arange(indices.shape[0])[:, None] < received) & (indices >= first) & (indices < first + experts)
        counts = np.bincount((indices - first)[valid], minlength=experts).astype(np.int32)
        if out is None:
            return counts
        out[:] = counts
        return out
    torch = _torch()
    received = total_recv_token_num if isinstance(total_recv_token_num, int) else total_recv_token_num[0]
    rows = torch.arange(indices.shape[0], device=indices.device)[:, None] < received
    valid = rows & (indices >= first) & (indices < first + experts)
    local = torch.where(valid, indices - first, 0).long().flatten()
    out = torch.zeros(experts, dtype=torch.int32, device=indices.device) if out is None else out.zero_()
    return out.scatter_add_(0, local, valid.flatten().int())


class EpDispatchCombineOp:
    def __init__(self, config: EpDispatchCombineConfig, bootstrap, backend=_rocep.Backend.AUTO):
        """Collective: every rank raises ConfigError if the config is invalid on any."""
        _agree_on_configs(config, bootstrap)
        try:
            self._group = Group(bootstrap, _ep_config(config), backend)
        except _rocep.ConfigError as error:  # raised on every rank alike (the group's creation agrees)
            message = str(error)
            for field, name in _CONFIG_NAMES:
                message = re.sub(field, name, message)
            raise _rocep.ConfigError(message) from None
        self.config = config
        self._weights = None  # the last dispatch's weights: combine returns them
        self._received = None  # dispatch's outputs, reused by every call (as MoRI's live in its buffers)
        self._indices = None  # out_indices, reused alike
        self._combined = None  # combine's output rows [max_num_inp_token_per_rank, hidden], reused alike

    def _dispatch_tuple(self, result):
        return result.tokens, result.topk_weights, result.scales, self._indices, result.num_recv_tokens

    def _write_global_indices(self) -> None:
        """The received rows' ids as global expert ids (-1 for the other ranks' slots) into self._indices,
        from the local ids the receive wrote; on the GPU by torch on the stream, without a host sync."""
        local = self._received.topk_ids
        first = self._group.rank * self.config.num_experts_per_rank
        if isinstance(local, np.ndarray):
            self._indices[:] = np.where(local >= 0, local + first, -1)
        else:
            # -1 stays -1; a local id gains the rank's first expert (torch.where has no out= with a scalar)
            self._indices.copy_(local).add_(local.ge(0).to(local.dtype) * first)

    def _allocate(self) -> None:
        if self._received is None:
            self._received = self._group._outputs()
            local = self._received.topk_ids
            self._indices = np.empty_like(local) if isinstance(local, np.ndarray) else _torch().empty_like(local)

    def _took_part(self, call, weights, scales) -> None:
        """Runs the group's dispatch or dispatch_send (`call`); its InvalidInputError names the op's
        arguments, and where this rank took part with zero tokens (issued) the next combine returns no
        weights."""
        try:
            call()
        except _rocep.InvalidInputError as error:
            if error.issued:
                self._weights = self._group._empty((0, self.config.num_experts_per_token), "float32")
            fp8_without_scales = (scales is None and str(self.config.data_type) in _FP8_ENCODINGS
                                  and re.search(r"\btokens: dtype must be bfloat16.*, is float8", str(error)))
            note = (" (scales is None: an fp8 op takes float8 input with its float32 scales [T, scale_dim], or "
                    "bf16 input, which dispatch quantises)") if fp8_without_scales else ""
            raise _renamed(error, note) from None
        self._weights = weights

    def _count_local_experts(self, call_local_expert_count: bool) -> None:
        """MoRI's call_local_expert_count: self.local_expert_count, the tokens per local expert, on the
        stream (local_expert_count below)."""
        if call_local_expert_count:
            self.local_expert_count = local_expert_count(self.config, self._indices, self._received.num_recv_tokens,
                                                         out=getattr(self, "local_expert_count", None))

    def dispatch(self, input, weights, scales, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                 call_local_expert_count=False):
        """Returns (out, out_weights, out_scales, out_indices, recv_num_token): out [P, hidden], the rows
        below recv_num_token[0] valid, in (source rank, source token) order. The launch settings are
        taken and ignored; call_local_expert_count fills self.local_expert_count."""
        self._allocate()
        self._took_part(lambda: self._group.dispatch(input, indices, weights, scales, out=self._received), weights,
                        scales)
        self._write_global_indices()
        self._count_local_experts(call_local_expert_count)
        return self._dispatch_tuple(self._received)

    def dispatch_send(self, input, weights, scales, indices, block_num=-1, warp_per_block=-1,
                      call_local_expert_count=False):
        """The send half: returns dispatch's tuple, whose tensors hold the tokens once dispatch_recv() ran
        (on the stream). The inputs must stay alive until then. As MoRI's, it counts nothing: pass
        call_local_expert_count to dispatch_recv."""
        self._allocate()
        self._took_part(lambda: self._group.dispatch_send(input, indices, weights, scales), weights, scales)
        return self._dispatch_tuple(self._received)

    def dispatch_recv(self, block_num=-1, warp_per_block=-1, call_local_expert_count=False) -> None:
        """The receive half: waits for every peer's send and fills dispatch_send's tensors."""
        self._group.dispatch_recv(out=self._received)
        self._write_global_indices()
        self._count_local_experts(call_local_expert_count)

    def _combined_rows(self):
        if self._combined is None:
            rows = max(self.config.max_num_inp_token_per_rank, 1)
            self._combined = self._group._empty((rows, self.config.hidden_dim), "bfloat16")
        return self._combined

    def combine(self, input, weights, indices, block_num=-1, rdma_block_num=-1, warp_per_block=-1,
                use_external_inp_buf=-1, call_reset=False):
        """Returns (out, out_weights): this rank's tokens [num_tokens, hidden] and their weights. The launch
        settings are taken and ignored; call_reset has nothing to reset."""
        try:
            out = self._group.combine(input, self._group._tokens, out=self._combined_rows())
        except _rocep.InvalidInputError as error:
            raise _renamed(error) from None
        return out, self._weights

    def combine_send(self, input, weights, indices, block_num=-1, warp_per_block=-1):
        """The send half: returns combine's pair, whose rows hold the tokens once combine_recv() ran."""
        num_tokens = self._group._tokens  # the last dispatch's, none where it took part with zero
        rows = self._combined_rows()
        try:
            self._group.combine_send(input, num_tokens, out=rows)
        except _rocep.InvalidInputError as error:
            raise _renamed(error) from None
        return rows[:num_tokens], self._weights

    def combine_recv(self, block_num=-1, warp_per_block=-1) -> None:
        """The receive half: waits for every peer's rows and sums them into combine_send's rows."""
        self._group.combine_recv()

    def get_dispatch_src_token_pos(self):
        """Per received row of the last dispatch, recv_num_token[0] of them: source rank *
        max_num_inp_token_per_rank + source token. Waits for the stream (the count is read on the host), as
        MoRI's does."""
        if self._received is None:
            raise _rocep.CallOrderError("get_dispatch_src_token_pos: no dispatch on this op yet")
        src_info = self._received.src_info[:self._received.count()]
        return src_info[:, 0] * self.config.max_num_inp_token_per_rank + src_info[:, 1]

    def poll_error(self) -> "RecordedError":
        """What the kernels recorded so far (Group.poll_error), without waiting: an expert id out of range or
        named twice by a token (its slot dropped). MoRI has no such call; rocep's op adds it."""
        return self._group.poll_error()

    def synchronize(self) -> None:
        """Waits for the op's stream and raises what the kernels recorded (Group.synchronize)."""
        self._group.synchronize()

    def close(self) -> None:
        """Releases the op's group now rather than when the op goes (Group.close: collective, refused on every
        rank while another thread is inside a call of it); afterwards every call raises rocep.CallOrderError."""
        self._group.close()

    def reset(self) -> None:
        """Nothing to reset: rocep's calls need no host work between them. Kept for MoRI's call sequence."""
