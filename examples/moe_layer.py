"""A whole MoE layer over rocep, checked against the same layer computed on one rank without EP.

router top-k -> rocep dispatch -> per expert: gate_up matmul, rocep's fused SiLU, down matmul -> the rank's
weighted sum per received token -> rocep combine. Runs on the CPU reference with numpy:

    mpirun -np 2 python examples/moe_layer.py

Every rank draws the same weights (a shared seed) and its own tokens; the layer's output on each rank is
compared with the layer computed on that rank's tokens alone, by calc_diff (1 - cosine-like similarity,
as DeepEP's tests measure it).
"""

import numpy as np

import rocep
from rocep import bf16, bootstrap


def calc_diff(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())


class Weights:
    """The layer's weights, the same on every rank: router [H, E], gate_up [E, H, 2N], down [E, N, H]."""

    def __init__(self, seed: int, hidden: int, experts: int, intermediate: int):
        rng = np.random.default_rng(seed)
        self.router = rng.standard_normal((hidden, experts)).astype(np.float32) / np.sqrt(hidden)
        self.gate_up = bf16.to_float(bf16.from_float(rng.standard_normal((experts, hidden, 2 * intermediate)) / np.sqrt(hidden)))
        self.down = bf16.to_float(bf16.from_float(rng.standard_normal((experts, intermediate, hidden)) / np.sqrt(intermediate)))
        self.intermediate = intermediate


def route(x_bits: np.ndarray, weights: Weights, top_k: int):
    """Top-k experts per token and their softmax weights (float32), from the router logits."""
    logits = bf16.to_float(x_bits) @ weights.router
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    chosen = np.take_along_axis(logits, ids, axis=1)
    gates = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return ids, (gates / gates.sum(axis=1, keepdims=True)).astype(np.float32)


def experts_forward(x_bits: np.ndarray, expert_of_row: np.ndarray, weights: Weights) -> np.ndarray:
    """Each row through its expert: gate_up (rounded to bf16), rocep's fused SiLU (bf16), down (float32).
    Rows are grouped by expert for the SiLU call, as a grouped GEMM would hand them over."""
    order = np.argsort(expert_of_row, kind="stable")
    experts = weights.gate_up.shape[0]
    offsets = np.searchsorted(expert_of_row[order], np.arange(experts + 1)).astype(np.uint32)
    gate_up = np.zeros((max(len(order), 1), 2 * weights.intermediate), np.uint16)
    for e in range(experts):
        rows = order[offsets[e]:offsets[e + 1]]
        gate_up[offsets[e]:offsets[e + 1]] = bf16.from_float(bf16.to_float(x_bits[rows]) @ weights.gate_up[e])
    act = np.zeros((gate_up.shape[0], weights.intermediate), np.uint16)
    rocep.silu_and_quantize(gate_up, act, None, offsets, weights.intermediate)
    out = np.zeros((len(order), x_bits.shape[1]), np.float32)
    for e in range(experts):
        rows = order[offsets[e]:offsets[e + 1]]
        out[rows] = bf16.to_float(act[offsets[e]:offsets[e + 1]]) @ weights.down[e]
    return out


def moe_layer_ep(group: rocep.Group, x_bits: np.ndarray, weights: Weights) -> np.ndarray:
    """The layer with its experts spread over the group's ranks."""
    config = group.config
    local = config.num_local_experts(group.world_size)
    ids, gates = route(x_bits, weights, config.top_k)
    received = group.dispatch(x_bits, ids, gates)
    count = received.count()
    rows, slots = np.nonzero(received.topk_ids[:count] >= 0)  # this rank's (row, slot) pairs
    first_expert = group.rank * local
    y = experts_forward(received.tokens[:count].view(np.uint16)[rows],
                        received.topk_ids[:count][rows, slots] + first_expert, weights)
    partial = np.zeros((config.max_recv_tokens(group.world_size), config.hidden), np.float32)
    np.add.at(partial, rows, received.topk_weights[:count][rows, slots][:, None] * y)
    return group.combine(bf16.from_float(partial), len(x_bits))


def moe_layer_alone(x_bits: np.ndarray, weights: Weights, top_k: int) -> np.ndarray:
    """The same layer on one rank, every expert here."""
    ids, gates = route(x_bits, weights, top_k)
    tokens, slots = np.nonzero(ids >= 0)
    y = experts_forward(x_bits[tokens], ids[tokens, slots], weights)
    out = np.zeros((len(x_bits), x_bits.shape[1]), np.float32)
    np.add.at(out, tokens, gates[tokens, slots][:, None] * y)
    return bf16.from_float(out)


def main(boot, seed: int = 2026, tokens: int = 48, hidden: int = 256, experts_per_rank: int = 4, top_k: int = 4,
         intermediate: int = 128) -> float:
    config = rocep.EpConfig()
    config.hidden, config.top_k, config.max_tokens_per_rank = hidden, top_k, tokens
    config.num_experts = experts_per_rank * boot.size()
    group = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    weights = Weights(seed, hidden, config.num_experts, intermediate)
    x = bf16.from_float(np.random.default_rng(seed + 1 + boot.rank()).standard_normal((tokens, hidden)))
    return calc_diff(bf16.to_float(moe_layer_ep(group, x, weights)), bf16.to_float(moe_layer_alone(x, weights, top_k)))


if __name__ == "__main__":
    from mpi4py import MPI

    diff = main(bootstrap.from_mpi4py(MPI.COMM_WORLD))
    print(f"rank {MPI.COMM_WORLD.Get_rank()}: calc_diff against the layer without EP = {diff:.3e}")
