"""The Python package on the GPU, under torchrun (no MPI): a rocep.Group on the GPU backend over a
torch.distributed bootstrap, against a CPU-reference group over the same bootstrap, bit for bit, on fresh
random torch tensors; then dispatch + combine captured in a torch.cuda.graph and replayed with new data.

    torchrun --nproc_per_node=2 python/gpu/check_torchrun.py
"""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import rocep
from rocep import bootstrap


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    config = rocep.EpConfig()
    config.hidden, config.top_k, config.num_experts = 2048, 8, 16 * world
    config.max_tokens_per_rank, config.expert_alignment = 128, 16
    boot = bootstrap.from_torch()
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    rows = config.max_recv_tokens(world)
    failures = []

    def check(name, got, expected):
        got = got.cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
        if got.shape != expected.shape or not np.array_equal(got.view(np.uint8), expected.view(np.uint8)):
            failures.append(name)

    def inputs(seed, n):
        g = torch.Generator().manual_seed(seed * 1000 + rank)
        tokens = (torch.rand(n, config.hidden, generator=g) * 8 - 4).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(config.num_experts, generator=g)[:config.top_k] for _ in range(n)])
        ids = ids.to(torch.int32)
        ids[torch.rand(ids.shape, generator=g) < 0.2] = -1
        weights = torch.rand(n, config.top_k, generator=g)
        expert_rows = (torch.rand(rows, config.hidden, generator=g) * 2 - 1).to(torch.bfloat16)
        return tokens, ids, weights, expert_rows

    for step, n in enumerate([128, 1, 77]):
        tokens, ids, weights, expert_rows = inputs(step, n)
        got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda())
        ref = cpu.dispatch(tokens.view(torch.uint16).numpy(), ids.numpy(), weights.numpy())
        count = ref.count()
        check(f"step {step} num_recv_tokens", got.num_recv_tokens, ref.num_recv_tokens)
        for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
            check(f"step {step} {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
        check(f"step {step} row_offsets", got.row_offsets.view(torch.int32), ref.row_offsets.view(np.int32))
        used = int(ref.row_offsets[-1])
        check(f"step {step} sorted_token_ids", got.sorted_token_ids[:used], ref.sorted_token_ids[:used])
        out = gpu.combine(expert_rows.cuda(), n)
        expected = cpu.combine(expert_rows.view(torch.uint16).numpy(), n)
        check(f"step {step} combined", out.view(torch.uint16), expected)
        gpu.synchronize()

    # Graph capture: the same count, new data written into the captured tensors before each replay.
    n = 64
    tokens, ids, weights, expert_rows = (t.cuda() for t in inputs(10, n))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = gpu.dispatch(tokens, ids, weights)
            captured_out = gpu.combine(expert_rows, n)
    for replay in range(3):
        new = inputs(20 + replay, n)
        for target, source in zip((tokens, ids, weights, expert_rows), new):
            target.copy_(source)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        ref = cpu.dispatch(new[0].view(torch.uint16).numpy(), new[1].numpy(), new[2].numpy())
        count = ref.count()
        check(f"replay {replay} tokens", captured.tokens[:count], ref.tokens[:count])
        expected = cpu.combine(new[3].view(torch.uint16).numpy(), n)
        check(f"replay {replay} combined", captured_out.view(torch.uint16), expected)

    all_failures = [None] * world
    dist.all_gather_object(all_failures, failures)
    if rank == 0:
        print("rank failures:", all_failures)
        print("PASSED" if not any(all_failures) else "FAILED")
    del graph, captured, captured_out, gpu, cpu  # collective teardown, while the process group lives
    dist.destroy_process_group()
    return 1 if any(all_failures) else 0


if __name__ == "__main__":
    sys.exit(main())
