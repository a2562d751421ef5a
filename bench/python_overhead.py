"""The Python package's cost at decode size on GPUs, under torchrun (one rank per GPU, no MPI).

Per call of fused dispatch and combine (per-token layout, bf16), for three ways of calling:
- rocep.Group: the native Python API, allocating its outputs per call, and writing into the outputs of an
  earlier call (out=);
- the module's EpGroup with its outputs converted once (what the Group calls underneath);
- the MoRI-shaped op (rocep.mori), which reuses its outputs as MoRI does.
Two figures each: the host time to issue the call (median, the slowest rank's) and the device time between
events around it (median, the slowest rank's). Every batch of calls is queued behind a spinning kernel, so
the host never waits for the device and the events time the device's work alone, as rocep_bench does;
its fused rows at the same shape give the C++ call's figures (its "host [us]" column).

    torchrun --nproc_per_node=2 bench/python_overhead.py [--tokens=128] [--hidden=7168] [--top-k=8]
                                                         [--experts=256] [--calls=50] [--rounds=5]
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import rocep
from rocep import bootstrap
from rocep.mori import EpDispatchCombineConfig, EpDispatchCombineOp


def slowest(value: float) -> float:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return max(gathered)


def time_calls(calls, rounds: int, count: int):
    """(host us, device us) per call of each of `calls` (callables issued in turn), medians over
    rounds x count issues, the slowest rank's."""
    host = [[] for _ in calls]
    device = [[] for _ in calls]
    for _ in range(rounds):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(calls) * count + 1)]
        dist.barrier()
        torch.cuda._sleep(200_000_000)  # holds the stream (~0.1 s) while the host queues the batch
        events[0].record()
        for i in range(count):
            for j, call in enumerate(calls):
                start = time.perf_counter()
                call()
                host[j].append(time.perf_counter() - start)
                events[i * len(calls) + j + 1].record()
        torch.cuda.synchronize()
        for i in range(count):
            for j in range(len(calls)):
                index = i * len(calls) + j
                device[j].append(events[index].elapsed_time(events[index + 1]) * 1e-3)
    return [(slowest(statistics.median(h)) * 1e6, slowest(statistics.median(d)) * 1e6)
            for h, d in zip(host, device)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--calls", type=int, default=50, help="pairs per timed batch")
    parser.add_argument("--rounds", type=int, default=5, help="timed batches")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    if args.experts % world != 0:
        parser.error(f"--experts={args.experts} is invalid: allowed are multiples of the world size {world}")
    measure(args, rank, world)  # its groups are gone when it returns: their teardown is collective
    dist.barrier()
    dist.destroy_process_group()


def measure(args, rank: int, world: int) -> None:
    config = rocep.EpConfig()
    config.hidden, config.top_k, config.num_experts = args.hidden, args.top_k, args.experts
    config.max_tokens_per_rank = args.tokens
    boot = bootstrap.from_torch()
    group = rocep.Group(boot, config)
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    tokens = torch.randn(args.tokens, args.hidden, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(args.tokens, args.experts, device="cuda", generator=g), dim=1)[:, :args.top_k]
    ids = ids.int()
    weights = torch.rand(args.tokens, args.top_k, device="cuda", generator=g)
    rows = group.config.max_recv_tokens(world)
    expert_outputs = torch.randn(rows, args.hidden, device="cuda", generator=g).to(torch.bfloat16)

    results = {}
    results["rocep.Group"] = time_calls(
        [lambda: group.dispatch(tokens, ids, weights), lambda: group.combine(expert_outputs, args.tokens)],
        args.rounds, args.calls)

    received = group.dispatch(tokens, ids, weights)
    out = group.combine(expert_outputs, args.tokens)
    results["rocep.Group, out= reused"] = time_calls(
        [lambda: group.dispatch(tokens, ids, weights, out=received),
         lambda: group.combine(expert_outputs, args.tokens, out=out)], args.rounds, args.calls)

    native, stream = group._group, torch.cuda.current_stream().cuda_stream
    results["the module's EpGroup, outputs converted once"] = time_calls(
        [lambda: native.dispatch(tokens, ids, weights, None, None, received.native, stream=stream),
         lambda: native.combine(expert_outputs, None, None, out, stream=stream)], args.rounds, args.calls)

    mori_config = EpDispatchCombineConfig(
        data_type=torch.bfloat16, rank=rank, world_size=world, hidden_dim=args.hidden, scale_dim=0,
        scale_type_size=0, max_token_type_size=4, max_num_inp_token_per_rank=args.tokens,
        num_experts_per_rank=args.experts // world, num_experts_per_token=args.top_k)
    op = EpDispatchCombineOp(mori_config, boot)
    results["rocep.mori op"] = time_calls(
        [lambda: op.dispatch(tokens, weights, None, ids), lambda: op.combine(expert_outputs, None, None)],
        args.rounds, args.calls)

    if rank == 0:
        print(f"\n{torch.cuda.get_device_name()} x {world}, {args.tokens} tokens, hidden {args.hidden}, "
              f"top-{args.top_k}, {args.experts} experts, per-token bf16, default SM budget")
        print(f"{'call':<48} {'dispatch host':>14} {'device':>8} {'combine host':>14} {'device':>8}   [us]")
        for name, ((dispatch_host, dispatch_device), (combine_host, combine_device)) in results.items():
            print(f"{name:<48} {dispatch_host:>14.1f} {dispatch_device:>8.1f} {combine_host:>14.1f} "
                  f"{combine_device:>8.1f}")


if __name__ == "__main__":
    main()
