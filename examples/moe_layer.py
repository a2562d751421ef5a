"""A whole MoE layer over rocep, checked against the same layer computed on one rank without EP.

router top-k -> rocep dispatch -> per expert: gate_up matmul, rocep's fused SiLU, down matmul -> the rank's
weighted sum per received token -> rocep combine. Two ways to run it:

    torchrun --nproc_per_node=2 examples/moe_layer.py [--dispatch=fp8] [--local-only]   # GPUs and torch, no MPI
    mpirun -np 2 python examples/moe_layer.py [--local-only]                           # the CPU reference, numpy

Every rank draws the same weights (a shared seed) and its own tokens, and compares the layer's output with
the layer computed on its own tokens alone, by calc_diff (1 - 2xy / (x^2 + y^2), as DeepEP's tests measure
it). With --local-only (attention run tensor-parallel) every rank holds the same
tokens, runs only its own experts on them and its slice of a shared expert, and an all-reduce of the
combined outputs gives the layer. With fp8 dispatch the layer alone computes on its tokens quantised and dequantised as dispatch does
(block-128, include/rocep/formats.hpp), so the two differ only in summation order and rounding.
"""

import argparse
import os

import numpy as np

import rocep
from rocep import bf16, bootstrap
from rocep.accuracy import calc_diff


class NumpyArrays:
    """Arrays on the CPU reference: numpy, bf16 as its uint16 bits."""

    def normal(self, seed: int, shape):
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

    def bf16(self, x):
        return bf16.from_float(x)

    def float(self, x):
        return bf16.to_float(x)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def top_k(self, logits, k: int):
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        return ids.astype(np.int32), np.take_along_axis(logits, ids, axis=1)

    def softmax(self, x):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    def group_rows(self, keys, groups: int):
        """(row order sorting keys stably, offsets [groups + 1] uint32)."""
        order = np.argsort(keys, kind="stable")
        return order, np.searchsorted(keys[order], np.arange(groups + 1)).astype(np.uint32)

    def nonzero(self, mask):
        return np.nonzero(mask)

    def add_rows(self, out, rows, values):
        np.add.at(out, rows, values)

    def to_list(self, x):
        return x.tolist()

    def stream(self) -> int:
        return 0


class TorchArrays:
    """Arrays on the GPU: torch tensors on the current device; rocep runs on torch's current stream."""

    def __init__(self):
        import torch

        self.torch = torch

    def normal(self, seed: int, shape):
        generator = self.torch.Generator().manual_seed(seed)
        return self.torch.randn(shape, generator=generator).cuda()

    def bf16(self, x):
        return x.to(self.torch.bfloat16)

    def float(self, x):
        return x.float()

    def zeros(self, shape):
        return self.torch.zeros(shape, device="cuda")

    def top_k(self, logits, k: int):
        values, ids = self.torch.topk(logits, k, dim=1)
        return ids.int(), values

    def softmax(self, x):
        return self.torch.softmax(x, dim=1)

    def group_rows(self, keys, groups: int):
        order = self.torch.argsort(keys, stable=True)
        groups = self.torch.arange(groups + 1, device=keys.device, dtype=keys.dtype)
        return order, self.torch.searchsorted(keys[order], groups).int()  # int32: rocep takes it as uint32

    def nonzero(self, mask):
        return self.torch.nonzero(mask, as_tuple=True)

    def add_rows(self, out, rows, values):
        out.index_add_(0, rows, values)

    def to_list(self, x):
        return x.tolist()

    def stream(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def fp8_round_trip(self, x, encoding):
        """x [T, hidden] bf16 quantised to fp8 block-128 and back, as rocep's dispatch quantises it."""
        dtype, largest = self.fp8_type(encoding)
        blocks = x.float().view(x.shape[0], x.shape[1] // 128, 128)
        amax = blocks.abs().amax(dim=2, keepdim=True).clamp(min=1e-4)
        codes = (blocks * (largest / amax)).clamp(-largest, largest).to(dtype)
        return self.bf16((codes.float() * (amax / largest)).view(x.shape))

    def dequantize(self, codes, scales):
        """Received fp8 rows ([rows, hidden] fp8, [rows, hidden / 128] float32 scales) as bf16."""
        return self.bf16(codes.float() * scales.repeat_interleave(128, dim=1))

    def fp8_type(self, encoding):
        if encoding == rocep.Fp8Encoding.E4M3FNUZ:
            return self.torch.float8_e4m3fnuz, 240.0
        return self.torch.float8_e4m3fn, 448.0


class Weights:
    """The layer's weights, the same on every rank: router [H, E], gate_up [E, H, 2N], down [E, N, H]."""

    def __init__(self, arrays, seed: int, hidden: int, experts: int, intermediate: int):
        self.router = arrays.normal(seed, (hidden, experts)) / np.sqrt(hidden)
        gate_up = arrays.normal(seed + 1, (experts, hidden, 2 * intermediate)) / np.sqrt(hidden)
        down = arrays.normal(seed + 2, (experts, intermediate, hidden)) / np.sqrt(intermediate)
        self.gate_up = arrays.float(arrays.bf16(gate_up))
        self.down = arrays.float(arrays.bf16(down))
        self.experts, self.intermediate = experts, intermediate


def route(arrays, x, weights: Weights, top_k: int):
    """Top-k experts per token (int32) and their softmax weights (float32), from the router logits."""
    ids, chosen = arrays.top_k(arrays.float(x) @ weights.router, top_k)
    return ids, arrays.softmax(chosen)


def experts_forward(arrays, x, expert_of_row, weights: Weights):
    """Each row through its expert: gate_up (rounded to bf16), rocep's fused SiLU (bf16), down (float32).
    Rows are grouped by expert for the SiLU call, as a grouped GEMM would hand them over."""
    order, offsets = arrays.group_rows(expert_of_row, weights.experts)
    bounds = arrays.to_list(offsets)
    rows = max(len(order), 1)
    gate_up = arrays.bf16(arrays.zeros((rows, 2 * weights.intermediate)))
    for e in range(weights.experts):
        segment = order[bounds[e]:bounds[e + 1]]
        gate_up[bounds[e]:bounds[e + 1]] = arrays.bf16(arrays.float(x[segment]) @ weights.gate_up[e])
    act = arrays.bf16(arrays.zeros((rows, weights.intermediate)))
    rocep.silu_and_quantize(gate_up, act, None, offsets, weights.intermediate, stream=arrays.stream())
    out = arrays.zeros((len(order), x.shape[1]))
    for e in range(weights.experts):
        out[order[bounds[e]:bounds[e + 1]]] = arrays.float(act[bounds[e]:bounds[e + 1]]) @ weights.down[e]
    return out


def moe_layer_ep(arrays, group: rocep.Group, x, weights: Weights, shared_expert_output=None):
    """The layer with its experts spread over the group's ranks (plus the shared expert's rows, which a
    local-only group adds on this rank's slice of the tokens only)."""
    config = group.config
    ids, gates = route(arrays, x, weights, config.top_k)
    received = group.dispatch(x, ids, gates)
    count = received.count()
    tokens = received.tokens[:count]  # bf16, or fp8 with its scales
    if config.dispatch_format == rocep.TokenFormat.FP8_BLOCK128:
        tokens = arrays.dequantize(tokens, received.scales[:count])
    topk_ids, topk_weights = received.topk_ids[:count], received.topk_weights[:count]
    rows, slots = arrays.nonzero(topk_ids >= 0)  # this rank's (row, slot) pairs
    first_expert = group.rank * config.num_local_experts(group.world_size)
    y = experts_forward(arrays, tokens[rows], topk_ids[rows, slots] + first_expert, weights)
    partial = arrays.zeros((config.max_recv_tokens(group.world_size), config.hidden))
    arrays.add_rows(partial, rows, topk_weights[rows, slots][:, None] * y)
    return group.combine(arrays.bf16(partial), len(x), shared_expert_output=shared_expert_output)


def moe_layer_alone(arrays, x, weights: Weights, top_k: int, expert_input=None):
    """The same layer on one rank, every expert here: routed on x, the experts fed expert_input (default x;
    with fp8 dispatch, x as the experts receive it)."""
    ids, gates = route(arrays, x, weights, top_k)
    tokens, slots = arrays.nonzero(ids >= 0)
    y = experts_forward(arrays, (x if expert_input is None else expert_input)[tokens], ids[tokens, slots], weights)
    out = arrays.zeros((len(x), x.shape[1]))
    arrays.add_rows(out, tokens, gates[tokens, slots][:, None] * y)
    return arrays.bf16(out)


def main(boot, arrays=None, dispatch: str = "bf16", seed: int = 2026, tokens: int = 48, hidden: int = 256,
         experts_per_rank: int = 4, top_k: int = 4, intermediate: int = 128, allreduce=None) -> float:
    """Runs the layer both ways on this rank's tokens; returns calc_diff. Collective. With `allreduce` (a
    float32 array's sum over the ranks), local-only mode: the same tokens on every rank, a shared expert."""
    arrays = arrays or NumpyArrays()
    gpu = isinstance(arrays, TorchArrays)
    if dispatch == "fp8" and not gpu:
        raise ValueError("--dispatch=fp8 is invalid on the CPU reference: numpy has no fp8 type; use torch")
    local_only = allreduce is not None
    config = rocep.EpConfig(hidden=hidden, top_k=top_k, max_tokens_per_rank=tokens,
                            num_experts=experts_per_rank * boot.size(),
                            dispatch_format="fp8-block128" if dispatch == "fp8" else "bf16",
                            local_only=local_only, allreduce_world_size=boot.size() if local_only else 1)
    group = rocep.Group(boot, config, rocep.Backend.GPU if gpu else rocep.Backend.CPU_REFERENCE)
    weights = Weights(arrays, seed, hidden, config.num_experts, intermediate)
    x = arrays.bf16(arrays.normal(seed + 3 + (0 if local_only else boot.rank()), (tokens, hidden)))
    received = arrays.fp8_round_trip(x, group.config.fp8_encoding) if dispatch == "fp8" else None
    if local_only:  # a dense shared expert; each rank's combine adds its slice of the tokens' rows
        shared = arrays.bf16(arrays.float(x) @ (arrays.normal(seed + 4, (hidden, hidden)) / np.sqrt(hidden)))
        ep = arrays.bf16(allreduce(arrays.float(moe_layer_ep(arrays, group, x, weights, shared))))
        alone = arrays.bf16(arrays.float(moe_layer_alone(arrays, x, weights, top_k, received)) + arrays.float(shared))
    else:
        ep, alone = moe_layer_ep(arrays, group, x, weights), moe_layer_alone(arrays, x, weights, top_k, received)
    if gpu:
        ep, alone = ep.float().cpu().numpy(), alone.float().cpu().numpy()
    else:
        ep, alone = bf16.to_float(ep), bf16.to_float(alone)
    return calc_diff(ep, alone)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dispatch", choices=("bf16", "fp8"), default="bf16", help="the dispatch format")
    parser.add_argument("--local-only", action="store_true",
                        help="local-only mode, the ranks' outputs summed by an all-reduce")
    args = parser.parse_args()
    if "LOCAL_RANK" not in os.environ and args.dispatch == "fp8":
        parser.error("--dispatch=fp8 runs on GPUs with torch (torchrun): numpy has no fp8 type")
    if "LOCAL_RANK" in os.environ:  # torchrun: GPUs, bootstrapped from torch.distributed
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        rank = dist.get_rank()

        def allreduce(a):  # through the host: the process group is gloo's
            summed = a.cpu()
            dist.all_reduce(summed)
            return summed.to(a.device)

        diff = main(bootstrap.from_torch(), TorchArrays(), args.dispatch, tokens=256, hidden=2048,
                    experts_per_rank=8, top_k=8, intermediate=512, allreduce=allreduce if args.local_only else None)
        dist.barrier()
    else:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        allreduce = (lambda a: MPI.COMM_WORLD.allreduce(a, op=MPI.SUM)) if args.local_only else None
        diff = main(bootstrap.from_mpi4py(MPI.COMM_WORLD), dispatch=args.dispatch, allreduce=allreduce)
    mode = ", local-only" if args.local_only else ""
    print(f"rank {rank}: {args.dispatch} dispatch{mode}, calc_diff against the layer without EP = {diff:.3e}")
