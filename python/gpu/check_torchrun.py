"""The Python package on the GPU, under torchrun (no MPI), bootstrapped from torch.distributed:

- rocep.Group on the GPU backend against a CPU-reference group over the same bootstrap, bit for bit, on
  fresh random torch tensors with a count and routing that change from call to call, into outputs poisoned
  before each call (the rows past the count must keep the poison) and typed (tokens bf16 or the group's fp8,
  block-128 scales float32, nvfp4's e4m3fn), the combine with a shared expert:
  per-token layout in bf16 and fp8 block-128 (quantised in dispatch), expanded layout in bf16, and
  local-only mode in both layouts; expert input scales (expanded, both fp8 encodings); nvfp4 quantised in
  dispatch with a global scale; mxfp8 and mxfp4 quantised in dispatch, both layouts;
- the MoRI-shaped op against a naive torch definition (every rank's inputs gathered, the expected rows and
  sums computed with torch on the CPU), bf16 and pre-quantised fp8, fused and split calls, and
  local_expert_count;
- dispatch + combine captured in torch.cuda.graph, replayed with new data, for the native group and the op;
- the combine epilogue (factor, per-token factors, residual) into a slice of a wider tensor, both layouts;
- tokens and expert rows written into the group's input buffers (torch views of its memory), and fp8 tokens
  already quantised into the dispatch input buffer;
- a group with cupy arrays (cupy inputs and outputs, calls on cupy's current stream), bit for bit;
- the group's GPU (Group.device): its outputs there, tokens on another GPU refused as a bad input, a call
  with another GPU current refused before anything is issued (a combine_recv so refused then repeated);
  torch fp8 tokens given to a bf16 group refused, the error naming the dtype given;
- a watchdog thread's polls (torch.cuda.set_device(group.device) in that thread) answered while the main
  thread waits in synchronize;
- Group.close(): refused while the last rank holds a view of the group's input buffer, then taken, the
  GPU's free memory grown by the group's memory_bytes, later calls refused;
- torch CPU tensors on the CPU reference, against numpy arrays.

    torchrun --nproc_per_node=2 python/gpu/check_torchrun.py

Local rank r runs on GPU r modulo the GPU count: on fewer GPUs than ranks, ranks share them (under MPS on
NVIDIA, started by the caller), and the checks that need a second GPU are left out.

Every run draws new inputs from a seed rank 0 picks and prints; ROCEP_CHECK_SEED=N repeats run N's inputs.
Rank 0 prints each rank's failures and PASSED or FAILED; the exit status is 1 on any failure.
"""

import dataclasses
import os
import secrets
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

import rocep
from rocep import bootstrap
from rocep.mori import EpDispatchCombineConfig, EpDispatchCombineOp

HIDDEN, TOP_K, EXPERTS_PER_RANK, MAX_TOKENS = 2048, 8, 16, 128
POISON = 0xA5
failures = []
run_seed = 0  # rank 0's draw, the same on every rank (main)


def shape_and_bytes(array):
    """A torch tensor (any dtype, fp8 included, on any device) or a numpy array as (shape, its bytes)."""
    if hasattr(array, "get"):  # cupy
        array = array.get()
    if hasattr(array, "cpu"):
        array = array.detach().cpu().contiguous()
        return tuple(array.shape), array.view(torch.uint8).numpy().tobytes() if array.numel() else b""
    array = np.ascontiguousarray(array)
    return array.shape, array.tobytes()


def check(name, got, expected):
    if shape_and_bytes(got) != shape_and_bytes(expected):
        failures.append(name)


def check_poison(name, array):
    """Every byte of `array` (a torch tensor) still holds the poison."""
    if array.numel() and not bool((array.contiguous().view(torch.uint8) == POISON).all()):
        failures.append(f"{name} written past the count")


def poison(result):
    """Every array of a dispatch result back to the poison."""
    for field in dataclasses.fields(result):
        array = getattr(result, field.name)
        if isinstance(array, torch.Tensor):
            array.view(torch.uint8).fill_(POISON)


def generator(seed, rank):
    """A generator for call `seed` of this run on `rank`, different from every other call's and run's."""
    return torch.Generator().manual_seed(run_seed * 1_000_000 + seed * 1000 + rank)


def config_for(world, layout=rocep.Layout.PER_TOKEN, dispatch_format=rocep.TokenFormat.BF16, local_only=False):
    return rocep.EpConfig(hidden=HIDDEN, top_k=TOP_K, num_experts=EXPERTS_PER_RANK * world,
                          max_tokens_per_rank=MAX_TOKENS, expert_alignment=16, layout=layout,
                          dispatch_format=dispatch_format, local_only=local_only,
                          allreduce_world_size=world if local_only else 1)


def inputs(seed, rank, n, world, rows):
    """Fresh random inputs on the CPU: tokens bf16, distinct ids with some -1, weights, expert rows bf16."""
    g = generator(seed, rank)
    tokens = (torch.rand(n, HIDDEN, generator=g) * 8 - 4).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(n, EXPERTS_PER_RANK * world, generator=g), dim=1)[:, :TOP_K].int()
    ids[torch.rand(ids.shape, generator=g) < 0.2] = -1
    weights = torch.rand(n, TOP_K, generator=g)
    expert_rows = (torch.rand(rows, HIDDEN, generator=g) * 2 - 1).to(torch.bfloat16)
    return tokens, ids, weights, expert_rows


def bits(tensor):
    return tensor.view(torch.uint16).numpy()


def torch_fp8(encoding):
    """torch's dtype of an fp8 encoding of rocep."""
    return {rocep.Fp8Encoding.E4M3FN: torch.float8_e4m3fn, rocep.Fp8Encoding.E4M3FNUZ: torch.float8_e4m3fnuz}[encoding]


def check_native(boot, rank, world, layout, dispatch_format, local_only=False):
    name = f"{layout} {dispatch_format}" + (" local-only" if local_only else "")
    gpu_config = config_for(world, layout, dispatch_format, local_only)
    gpu = rocep.Group(boot, gpu_config, rocep.Backend.GPU, layout)
    cpu = rocep.Group(boot, gpu_config, rocep.Backend.CPU_REFERENCE, layout)
    expanded = layout == rocep.Layout.EXPANDED
    rows = gpu.config.max_recv_rows(world) if expanded else gpu.config.max_recv_tokens(world)
    # A call of other data first; each step writes into its outputs, poisoned before, and into a poisoned
    # `out` longer than its tokens.
    tokens, ids, weights, expert_rows = inputs(99, rank, MAX_TOKENS, world, rows)
    got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda())
    gpu.combine(expert_rows.cuda(), MAX_TOKENS, **({"row_weights": got.weights} if expanded else {}))
    fp8 = dispatch_format == rocep.TokenFormat.FP8_BLOCK128
    typed = [(got.tokens, torch_fp8(gpu.config.fp8_encoding) if fp8 else torch.bfloat16, (rows, HIDDEN))]
    if fp8:
        typed.append((got.scales, torch.float32, (HIDDEN // 128, rows) if expanded else (rows, HIDDEN // 128)))
    for array, dtype, shape in typed:
        if array.dtype != dtype or tuple(array.shape) != shape:
            failures.append(f"{name} outputs: {array.dtype} {tuple(array.shape)}, not {dtype} {shape}")
    out = torch.empty(MAX_TOKENS + 3, HIDDEN, dtype=torch.bfloat16, device="cuda")
    for step, n in enumerate([MAX_TOKENS, 1, 77, 0, 100]):
        tokens, ids, weights, expert_rows = inputs(step, rank, n, world, rows)
        shared = expert_rows[:n].flip(1).contiguous()  # a shared expert's rows, other values than the experts'
        poison(got)
        out.view(torch.uint8).fill_(POISON)
        got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda(), out=got)
        ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
        count = ref.count()
        fields = ("tokens", "src_info", "weights") if expanded else ("tokens", "topk_ids", "topk_weights", "src_info")
        for field in fields:
            check(f"{name} step {step} {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
            check_poison(f"{name} step {step} {field}", getattr(got, field)[count:])
        if dispatch_format != rocep.TokenFormat.BF16:  # float32 [P, hidden / 128], expanded [hidden / 128, R]
            check(f"{name} step {step} scales", got.scales[:, :count] if expanded else got.scales[:count],
                  ref.scales[:, :count] if expanded else ref.scales[:count])
            if not expanded:
                check_poison(f"{name} step {step} scales", got.scales[count:])
        check(f"{name} step {step} row_offsets", got.row_offsets.view(torch.int32), ref.row_offsets.view(np.int32))
        if not expanded:
            check(f"{name} step {step} num_recv_tokens", got.num_recv_tokens, ref.num_recv_tokens)
            used, blocks = int(ref.row_offsets[-1]), int(ref.row_offsets[-1]) // gpu_config.expert_alignment
            check(f"{name} step {step} sorted_token_ids", got.sorted_token_ids[:used], ref.sorted_token_ids[:used])
            check_poison(f"{name} step {step} sorted_token_ids", got.sorted_token_ids[used:])
            check(f"{name} step {step} block_expert_ids", got.block_expert_ids[:blocks],
                  ref.block_expert_ids[:blocks])
            check_poison(f"{name} step {step} block_expert_ids", got.block_expert_ids[blocks:])
            gpu.combine(expert_rows.cuda(), n, shared.cuda(), out=out)
            expected = cpu.combine(bits(expert_rows), n, bits(shared))
        else:
            gpu.combine(expert_rows.cuda(), n, shared.cuda(), row_weights=got.weights, out=out)
            expected = cpu.combine(bits(expert_rows), n, bits(shared), row_weights=ref.weights)
        check(f"{name} step {step} combined", out[:n].view(torch.uint16), expected[:n])
        check_poison(f"{name} step {step} combined", out[n:])
        gpu.synchronize()


def check_input_scales(boot, rank, world):
    """expert_input_scales (expanded, bf16) on the GPU against the reference: the rows' fp8 codes, both
    encodings, with the dispatch's other outputs and its combine."""
    for encoding in (rocep.Fp8Encoding.E4M3FN, rocep.Fp8Encoding.E4M3FNUZ):
        config = config_for(world, rocep.Layout.EXPANDED)
        config.fp8_encoding = encoding
        gpu = rocep.Group(boot, config, rocep.Backend.GPU, rocep.Layout.EXPANDED)
        cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE, rocep.Layout.EXPANDED)
        rows, local = gpu.config.max_recv_rows(world), config.num_local_experts(world)
        for step, n in enumerate([MAX_TOKENS, 45]):
            name = f"input scales {encoding} step {step}"
            tokens, ids, weights, expert_rows = inputs(20 + step, rank, n, world, rows)
            g = generator(30 + step, rank)
            scales = torch.exp2(torch.rand(local, generator=g) * 12 - 8)  # 2^-8 to 2^4
            got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda(), expert_input_scales=scales.cuda())
            ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy(), expert_input_scales=scales.numpy())
            used = ref.count()
            if got.input_scaled_tokens().dtype != torch_fp8(encoding):
                failures.append(f"{name} codes: {got.input_scaled_tokens().dtype}, not {torch_fp8(encoding)}")
            codes = shape_and_bytes(got.input_scaled_tokens())[1][:used * HIDDEN]
            if codes != shape_and_bytes(ref.input_scaled_tokens())[1][:used * HIDDEN]:
                failures.append(f"{name} codes")
            for field in ("src_info", "weights"):
                check(f"{name} {field}", getattr(got, field)[:used], getattr(ref, field)[:used])
            out = gpu.combine(expert_rows.cuda(), n, row_weights=got.weights)
            expected = cpu.combine(bits(expert_rows), n, row_weights=ref.weights)
            check(f"{name} combined", out.view(torch.uint16), expected)
            gpu.synchronize()


def check_nvfp4_global_scale(boot, rank, world):
    """nvfp4 dispatch of bf16 tokens with a global scale (float32 [1], the same on every rank) on the GPU
    against the reference: the payload and scales of every received row, fused and split."""
    config = config_for(world, dispatch_format=rocep.TokenFormat.NVFP4)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    rows = gpu.config.max_recv_tokens(world)
    for step, n in enumerate([MAX_TOKENS, 37]):
        tokens, ids, weights, expert_rows = inputs(110 + step, rank, n, world, rows)
        global_scale = torch.tensor([448 * 6 / (1.5 + step)], dtype=torch.float32)  # |tokens| < 4: some saturate
        if step == 1:
            gpu.dispatch_send(tokens.cuda(), ids.cuda(), weights.cuda(), global_scale=global_scale.cuda())
            got = gpu.dispatch_recv()
        else:
            got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda(), global_scale=global_scale.cuda())
        ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy(), global_scale=global_scale.numpy())
        count = ref.count()
        if got.tokens.dtype != torch.uint8 or got.scales.dtype != torch.float8_e4m3fn:
            failures.append(f"nvfp4 step {step} outputs: {got.tokens.dtype}, {got.scales.dtype}")
        for field in ("tokens", "scales", "topk_ids", "src_info"):
            check(f"nvfp4 step {step} {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
        check(f"nvfp4 step {step} combined", gpu.combine(expert_rows.cuda(), n).view(torch.uint16),
              cpu.combine(bits(expert_rows), n))
    gpu.synchronize()


def check_mx_formats(boot, rank, world):
    """mxfp8 and mxfp4 quantised in dispatch on the GPU against the reference, both layouts: the payload and
    scales of every received row, typed (mxfp8 codes float8_e4m3fn, fp4 uint8, scales float8_e8m0fnu)."""
    e8m0 = getattr(torch, "float8_e8m0fnu", torch.uint8)
    for dispatch_format, payload_dtype in ((rocep.TokenFormat.MXFP8, torch.float8_e4m3fn),
                                           (rocep.TokenFormat.MXFP4, torch.uint8)):
        for layout in (rocep.Layout.PER_TOKEN, rocep.Layout.EXPANDED):
            name = f"{dispatch_format} {layout}"
            expanded = layout == rocep.Layout.EXPANDED
            config = config_for(world, layout, dispatch_format)
            gpu = rocep.Group(boot, config, rocep.Backend.GPU, layout)
            cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE, layout)
            rows = gpu.config.max_recv_rows(world) if expanded else gpu.config.max_recv_tokens(world)
            for step, n in enumerate([MAX_TOKENS, 29]):
                tokens, ids, weights, expert_rows = inputs(140 + step, rank, n, world, rows)
                got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda())
                ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
                count = ref.count()
                if got.tokens.dtype != payload_dtype or got.scales.dtype != e8m0:
                    failures.append(f"{name} outputs: {got.tokens.dtype}, {got.scales.dtype}")
                check(f"{name} step {step} tokens", got.tokens[:count], ref.tokens[:count])
                check(f"{name} step {step} scales", got.scales[:count], ref.scales[:count])  # [rows, hidden / 32]
                check(f"{name} step {step} src_info", got.src_info[:count], ref.src_info[:count])
                out = gpu.combine(expert_rows.cuda(), n, row_weights=got.weights if expanded else None)
                expected = cpu.combine(bits(expert_rows), n, row_weights=ref.weights if expanded else None)
                check(f"{name} step {step} combined", out.view(torch.uint16), expected)
            gpu.synchronize()


def check_cupy(boot, rank, world):
    """A group whose arrays are cupy's: cupy inputs (bf16 as uint16 bits), cupy outputs, cupy's stream."""
    try:
        import cupy
    except ImportError:
        print(f"rank {rank}: cupy is not installed: its check did not run")
        return
    config = config_for(world)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU, arrays="cupy")
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    rows = gpu.config.max_recv_tokens(world)
    with cupy.cuda.Stream(non_blocking=True):
        for step, n in enumerate([MAX_TOKENS, 5, 0, 60]):
            tokens, ids, weights, expert_rows = inputs(80 + step, rank, n, world, rows)
            got = gpu.dispatch(cupy.asarray(bits(tokens)), cupy.asarray(ids.long().numpy()),
                               cupy.asarray(weights.numpy()))
            ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
            count = ref.count()
            if not isinstance(got.tokens, cupy.ndarray):
                failures.append(f"cupy step {step}: outputs are {type(got.tokens)}, not cupy arrays")
            for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
                check(f"cupy step {step} {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
            check(f"cupy step {step} combined", gpu.combine(cupy.asarray(bits(expert_rows)), n),
                  cpu.combine(bits(expert_rows), n))
        gpu.synchronize()


def check_input_buffers(boot, rank, world):
    """Tokens written into the group's dispatch input buffer and expert rows into its combine input buffer
    (torch views of the group's memory), against the reference's dispatch and combine of copies."""
    config = config_for(world)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    tokens_buffer, rows_buffer = gpu.dispatch_input_buffer(), gpu.combine_input_buffer()
    if tokens_buffer.dtype != torch.bfloat16 or tuple(rows_buffer.shape) != (gpu.config.max_recv_tokens(world), HIDDEN):
        failures.append(f"input buffers: {tokens_buffer.dtype} {tuple(rows_buffer.shape)}")
    buffers = (MAX_TOKENS + gpu.config.max_recv_tokens(world)) * HIDDEN * 2  # both input buffers, counted
    if gpu.memory_bytes < buffers or cpu.memory_bytes != 0:
        failures.append(f"memory_bytes: {gpu.memory_bytes} on the GPU (its input buffers {buffers}), "
                        f"{cpu.memory_bytes} on the CPU reference")
    for step, n in enumerate([MAX_TOKENS, 33, 0, 90]):
        tokens, ids, weights, expert_rows = inputs(60 + step, rank, n, world, rows_buffer.shape[0])
        tokens_buffer[:n].copy_(tokens)
        got = gpu.dispatch(tokens_buffer[:n], ids.cuda(), weights.cuda())
        ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
        count = ref.count()
        for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
            check(f"input buffers step {step} {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
        rows_buffer.copy_(expert_rows)
        check(f"input buffers step {step} combined", gpu.combine(rows_buffer, n).view(torch.uint16),
              cpu.combine(bits(expert_rows), n))
    gpu.synchronize()


def check_quantised_input_buffer(boot, rank, world):
    """fp8 block-128 tokens already quantised, written into the group's dispatch input buffer (a torch uint8
    view of its memory, each row the codes and then the float32 scales), against the reference's dispatch of
    the same codes and scales passed as token_scales."""
    config = config_for(world, dispatch_format=rocep.TokenFormat.FP8_BLOCK128)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    buffer = gpu.dispatch_input_buffer()
    row_bytes = rocep.format_input_row_bytes(config.dispatch_format, HIDDEN)
    if buffer.dtype != torch.uint8 or tuple(buffer.shape) != (MAX_TOKENS, row_bytes):
        failures.append(f"quantised input buffer: {buffer.dtype} {tuple(buffer.shape)}")
    blocks = HIDDEN // 128
    rows = np.zeros((gpu.config.max_recv_tokens(world), HIDDEN), np.uint16)
    device_rows = torch.zeros(rows.shape, dtype=torch.bfloat16, device="cuda")
    for step, n in enumerate([MAX_TOKENS, 17, 0, 64]):
        _, ids, weights, _ = inputs(120 + step, rank, n, world, 1)
        g = generator(125 + step, rank)
        codes = torch.randint(0, 120, (n, HIDDEN), generator=g, dtype=torch.uint8)
        scales = torch.rand(n, blocks, generator=g) + 0.5
        buffer[:n, :HIDDEN].copy_(codes)
        buffer[:n, HIDDEN:HIDDEN + 4 * blocks].copy_(scales.view(torch.uint8))
        got = gpu.dispatch(buffer[:n], ids.cuda(), weights.cuda())
        ref = cpu.dispatch(codes.numpy(), ids.numpy(), weights.numpy(), token_scales=scales.numpy())
        count = ref.count()
        for field in ("tokens", "scales", "topk_ids", "topk_weights", "src_info"):
            check(f"quantised input buffer step {step} {field}", getattr(got, field)[:count],
                  getattr(ref, field)[:count])
        gpu.combine(device_rows, n)
        cpu.combine(rows, n)
    gpu.synchronize()


def check_scales_of_odd_strides(boot, rank, world):
    """fp8 block-128 scales that torch calls contiguous but whose last stride is not 1 (hidden 128: one
    scale per token, [T, 1] made by a transpose), and zero rows: dispatched as their contiguous copies are."""
    config = rocep.EpConfig(config_for(world, dispatch_format=rocep.TokenFormat.FP8_BLOCK128), hidden=128)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    for step, n in enumerate([9, 0]):
        _, ids, weights, _ = inputs(130 + step, rank, n, world, 1)
        g = generator(135 + step, rank)
        codes = torch.randint(0, 120, (n, 128), generator=g, dtype=torch.uint8)
        scales = (torch.rand(1, n, generator=g) + 0.5).t()  # strides (1, n)
        got = gpu.dispatch(codes.cuda(), ids.cuda(), weights.cuda(), token_scales=scales.cuda())
        ref = cpu.dispatch(codes.numpy(), ids.numpy(), weights.numpy(), token_scales=scales.contiguous().numpy())
        count = ref.count()
        for field in ("tokens", "scales", "src_info"):
            check(f"scales of odd strides, {n} tokens, {field}", getattr(got, field)[:count],
                  getattr(ref, field)[:count])
        gpu.combine(torch.zeros((gpu.config.max_recv_tokens(world), 128), dtype=torch.bfloat16, device="cuda"), n)
        cpu.combine(np.zeros((cpu.config.max_recv_tokens(world), 128), np.uint16), n)
    gpu.synchronize()


def check_epilogue(boot, rank, world):
    """The combine epilogue on torch tensors, into the first hidden columns of a wider tensor, against the
    CPU reference's, both layouts (the expanded one weighted)."""
    for layout in (rocep.Layout.PER_TOKEN, rocep.Layout.EXPANDED):
        config = config_for(world, layout)
        gpu = rocep.Group(boot, config, rocep.Backend.GPU, layout)
        cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE, layout)
        expanded = layout == rocep.Layout.EXPANDED
        rows = gpu.config.max_recv_rows(world) if expanded else gpu.config.max_recv_tokens(world)
        for step, n in enumerate([MAX_TOKENS, 9, 0]):
            tokens, ids, weights, expert_rows = inputs(90 + step, rank, n, world, rows)
            g = generator(95 + step, rank)
            factors = torch.rand(n, generator=g) * 2 - 1
            residual = (torch.rand(n, HIDDEN, generator=g) * 2 - 1).to(torch.bfloat16)
            got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda())
            ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
            wide = torch.full((max(n, 1), HIDDEN + 16), -7.0, dtype=torch.bfloat16, device="cuda")
            weighted = {"row_weights": got.weights} if expanded else {}
            gpu.combine(expert_rows.cuda(), n, out=wide[:, :HIDDEN], factor=0.75, token_factors=factors.cuda(),
                        residual=residual.cuda(), **weighted)
            expected = cpu.combine(bits(expert_rows), n, factor=0.75, token_factors=factors.numpy(),
                                   residual=bits(residual), **({"row_weights": ref.weights} if expanded else {}))
            check(f"epilogue {layout} step {step}", wide[:n, :HIDDEN].contiguous().view(torch.uint16), expected)
            if (wide[:, HIDDEN:] != -7.0).any():
                failures.append(f"epilogue {layout} step {step}: written between the rows")
        gpu.synchronize()


def replay_with(graph, captured_inputs, new_inputs):
    """Writes new data into the tensors a graph captured as its inputs, replays it and waits for it."""
    for target, source in zip(captured_inputs, new_inputs):
        target.copy_(source)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()


def check_native_graph(boot, rank, world):
    """One count, new data written into the captured tensors before each replay."""
    config = config_for(world)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    n, rows = 64, gpu.config.max_recv_tokens(world)
    tokens, ids, weights, expert_rows = (t.cuda() for t in inputs(10, rank, n, world, rows))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = gpu.dispatch(tokens, ids, weights)
            captured_out = gpu.combine(expert_rows, n)
    for replay in range(3):
        new = inputs(20 + replay, rank, n, world, rows)
        replay_with(graph, (tokens, ids, weights, expert_rows), new)
        ref = cpu.dispatch(bits(new[0]), new[1].numpy(), new[2].numpy())
        count = ref.count()
        check(f"graph replay {replay} tokens", captured.tokens[:count], ref.tokens[:count])
        check(f"graph replay {replay} topk_ids", captured.topk_ids[:count], ref.topk_ids[:count])
        check(f"graph replay {replay} combined", captured_out.view(torch.uint16), cpu.combine(bits(new[3]), n))
    del graph


def fp8_quantise(tokens):
    """bf16 [n, hidden] -> (e4m3fn codes, float32 block-128 scales [n, hidden / 128]), any valid encoding."""
    blocks = tokens.float().view(tokens.shape[0], tokens.shape[1] // 128, 128)
    amax = blocks.abs().amax(dim=2).clamp(min=1e-4)
    codes = (blocks * (448.0 / amax[:, :, None])).clamp(-448, 448).to(torch.float8_e4m3fn)
    return codes.view(tokens.shape), amax / 448.0


def naive_mori(rank, world, all_tokens, all_ids, all_weights, all_scales):
    """What rank `rank` receives by the op's definition: per source rank, then token, each token with an
    expert here once; its indices global for this rank's experts, -1 elsewhere."""
    first, last = rank * EXPERTS_PER_RANK, (rank + 1) * EXPERTS_PER_RANK
    rows = []
    for source in range(world):
        for t in range(all_ids[source].shape[0]):
            mine = (all_ids[source][t] >= first) & (all_ids[source][t] < last)
            if mine.any():
                rows.append((source, t, torch.where(mine, all_ids[source][t], -1)))
    tokens = torch.stack([all_tokens[s][t] for s, t, _ in rows]) if rows else None
    scales = torch.stack([all_scales[s][t] for s, t, _ in rows]) if rows and all_scales[0] is not None else None
    weights = torch.stack([all_weights[s][t] for s, t, _ in rows]) if rows else None
    indices = torch.stack([i for _, _, i in rows]) if rows else None
    return [(s, t) for s, t, _ in rows], tokens, scales, weights, indices


def check_mori(boot, rank, world, fp8):
    name = "mori fp8" if fp8 else "mori bf16"
    config = EpDispatchCombineConfig(
        data_type=torch.float8_e4m3fn if fp8 else torch.bfloat16, rank=rank, world_size=world,
        hidden_dim=HIDDEN, scale_dim=HIDDEN // 128 if fp8 else 0, scale_type_size=4 if fp8 else 0,
        max_token_type_size=4, max_num_inp_token_per_rank=MAX_TOKENS, num_experts_per_rank=EXPERTS_PER_RANK,
        num_experts_per_token=TOP_K)
    op = EpDispatchCombineOp(config, boot, rocep.Backend.GPU)
    for step, n in enumerate([MAX_TOKENS, 13, 0, 90]):
        tokens, ids, weights, _ = inputs(40 + step, rank, n, world, 0)
        scales = None
        if fp8:
            tokens, scales = fp8_quantise(tokens)
        gathered = [None] * world  # fp8 tensors do not pickle: their bytes travel
        dist.all_gather_object(gathered, (tokens.view(torch.uint8), ids, weights, scales))
        gathered = [(payload.view(tokens.dtype), *rest) for payload, *rest in gathered]
        order, want_tokens, want_scales, want_weights, want_indices = naive_mori(rank, world, *zip(*gathered))
        split = step % 2 == 1  # odd steps through the split calls
        arguments = (tokens.cuda(), weights.cuda(), scales.cuda() if fp8 else None, ids.long().cuda())
        if split:
            out, out_weights, out_scales, out_indices, recv_num_token = op.dispatch_send(*arguments)
            op.dispatch_recv()
        else:
            out, out_weights, out_scales, out_indices, recv_num_token = op.dispatch(*arguments)
        count = int(recv_num_token[0])
        naive_counts = torch.zeros(EXPERTS_PER_RANK, dtype=torch.int32)
        if count:
            valid = want_indices[want_indices >= 0] - rank * EXPERTS_PER_RANK
            naive_counts += torch.bincount(valid.long(), minlength=EXPERTS_PER_RANK).int()
        check(f"{name} step {step} local_expert_count",
              rocep.mori.local_expert_count(config, out_indices, recv_num_token), naive_counts)
        if count != len(order):
            failures.append(f"{name} step {step} recv_num_token {count}, expected {len(order)}")
            continue
        if count:
            check(f"{name} step {step} out", out[:count], want_tokens)
            check(f"{name} step {step} out_weights", out_weights[:count], want_weights)
            check(f"{name} step {step} out_indices", out_indices[:count], want_indices)
            if fp8:
                check(f"{name} step {step} out_scales", out_scales[:count], want_scales)
        # Combine: the expert output of a row is half its token, as bf16; every rank's rows are gathered
        # and each of this rank's tokens summed over the ranks that received it, ascending, in float32.
        value = (out[:count].float() * 0.5).to(torch.bfloat16)
        expert_output = torch.zeros(out.shape[0], HIDDEN, dtype=torch.bfloat16, device="cuda")
        expert_output[:count] = value
        if split:
            combined, combined_weights = op.combine_send(expert_output, out_weights, out_indices)
            op.combine_recv()
        else:
            combined, combined_weights = op.combine(expert_output, out_weights, out_indices)
        sent = [None] * world
        dist.all_gather_object(sent, (order, expert_output[:count].cpu()))
        expected = torch.zeros(n, HIDDEN)
        for source_rank in range(world):
            for row, (source, t) in enumerate(sent[source_rank][0]):
                if source == rank:
                    expected[t] += sent[source_rank][1][row].float()
        check(f"{name} step {step} combined", combined[:n], expected.to(torch.bfloat16))
        check(f"{name} step {step} combined weights", combined_weights, weights.cuda())


def check_mori_graph(boot, rank, world):
    config = EpDispatchCombineConfig(
        data_type=torch.bfloat16, rank=rank, world_size=world, hidden_dim=HIDDEN, scale_dim=0, scale_type_size=0,
        max_token_type_size=4, max_num_inp_token_per_rank=MAX_TOKENS, num_experts_per_rank=EXPERTS_PER_RANK,
        num_experts_per_token=TOP_K)
    op = EpDispatchCombineOp(config, boot, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config_for(world), rocep.Backend.CPU_REFERENCE)
    n, rows = 48, cpu.config.max_recv_tokens(world)
    tokens, ids, weights, _ = (t.cuda() if t is not None else None for t in inputs(60, rank, n, world, 0))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, _, _, _, recv_num_token = op.dispatch(tokens, weights, None, ids)
            combined, _ = op.combine(out, None, None)  # each received row back unchanged: the sum of its copies
    for replay in range(3):
        new = inputs(70 + replay, rank, n, world, 0)
        replay_with(graph, (tokens, ids, weights), new)
        ref = cpu.dispatch(bits(new[0]), new[1].numpy(), new[2].numpy())
        count = ref.count()
        check(f"mori graph replay {replay} out", out[:count], ref.tokens[:count].view(np.uint16))
        echoed = np.zeros((rows, HIDDEN), np.uint16)
        echoed[:count] = ref.tokens[:count].view(np.uint16)
        check(f"mori graph replay {replay} combined", combined.view(torch.uint16), cpu.combine(echoed, n))
    del graph


def check_devices(boot, rank, world):
    """The group is on the GPU current at its creation (Group.device), and so are its outputs and views.
    Where every rank sees two GPUs, the last rank passes tokens on the other GPU (a bad input: it takes part
    with zero tokens and raises, issued, naming tokens and both GPUs), then calls with the other GPU current
    (refused before anything is issued, naming both GPUs), and calls combine_recv with it current (refused,
    then repeated with its own GPU current); the group's next calls match the reference."""
    config = config_for(world)
    gpu = rocep.Group(boot, config, rocep.Backend.GPU)
    cpu = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    own = torch.cuda.current_device()
    buffer = gpu.dispatch_input_buffer()
    if gpu.device != own or cpu.device != -1 or buffer.device != torch.device("cuda", own):
        failures.append(f"devices: group {gpu.device}, reference {cpu.device}, input buffer {buffer.device}, "
                        f"current {own}")
    counts = [None] * world
    dist.all_gather_object(counts, torch.cuda.device_count())
    rows = gpu.config.max_recv_tokens(world)
    tokens, ids, weights, expert_rows = inputs(95, rank, 40, world, rows)
    if min(counts) >= 2:
        bad = rank == world - 1
        other = (own + 1) % torch.cuda.device_count()
        elsewhere = tokens.to(torch.device("cuda", other)) if bad else tokens.cuda()
        try:
            gpu.dispatch(elsewhere, ids.cuda(), weights.cuda())
            if bad:
                failures.append("devices: tokens on another GPU taken")
        except rocep.InvalidInputError as error:
            if not (bad and error.issued and "tokens" in str(error) and f"GPU {other}" in str(error)
                    and f"GPU {own}" in str(error)):
                failures.append(f"devices: tokens on another GPU: {error} (issued {error.issued})")
        gpu.combine(torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device="cuda"), 0 if bad else len(ids))
        if bad:
            torch.cuda.set_device(other)
            try:
                gpu.dispatch(tokens.cuda(own), ids.cuda(own), weights.cuda(own))
                failures.append("devices: a call with another GPU current taken")
            except rocep.InvalidInputError as error:
                if error.issued or f"GPU {other}" not in str(error) or f"GPU {own}" not in str(error):
                    failures.append(f"devices: call with another GPU current: {error} (issued {error.issued})")
            torch.cuda.set_device(own)
    last = rank == world - 1  # gives torch fp8 tokens to this bf16 group: refused, naming their dtype
    try:
        gpu.dispatch(tokens.cuda().float().to(torch.float8_e4m3fn) if last else tokens.cuda(), ids.cuda(),
                     weights.cuda())
        if last:
            failures.append("devices: fp8 tokens taken by a bf16 group")
    except rocep.InvalidInputError as error:
        if not (last and error.issued and "tokens: dtype must be bfloat16" in str(error)
                and "is float8_e4m3fn" in str(error)):
            failures.append(f"devices: fp8 tokens: {error} (issued {error.issued})")
    gpu.combine(torch.zeros(rows, HIDDEN, dtype=torch.bfloat16, device="cuda"), 0 if last else len(ids))
    got = gpu.dispatch(tokens.cuda(), ids.cuda(), weights.cuda())
    ref = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
    count = ref.count()
    for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
        check(f"devices {field}", getattr(got, field)[:count], getattr(ref, field)[:count])
        if getattr(got, field).device != torch.device("cuda", own):
            failures.append(f"devices: {field} on {getattr(got, field).device}")
    if min(counts) >= 2:  # a combine_recv refused on the last rank is repeated there with its GPU current
        gpu.combine_send(expert_rows.cuda(), len(ids))
        if rank == world - 1:
            torch.cuda.set_device(other)
            try:
                gpu.combine_recv()
                failures.append("devices: a combine_recv with another GPU current taken")
            except rocep.InvalidInputError as error:
                if error.issued or f"GPU {other}" not in str(error):
                    failures.append(f"devices: combine_recv with another GPU current: {error} "
                                    f"(issued {error.issued})")
            torch.cuda.set_device(own)
        combined = gpu.combine_recv()
    else:
        combined = gpu.combine(expert_rows.cuda(), len(ids))
    check("devices combined", combined.view(torch.uint16), cpu.combine(bits(expert_rows), len(ids)))
    gpu.synchronize()


def check_watchdog(boot, rank, world):
    """A watchdog thread polls the group, its GPU made current there first, while this thread waits in
    synchronize for a dispatch and a combine and then a sleep kernel of about 0.3 s on the group's stream:
    many polls are answered meanwhile, none raises or reports anything. Then an invalid id, which a poll
    reads as a RecordedError once the stream is done and synchronize raises."""
    gpu = rocep.Group(boot, config_for(world), rocep.Backend.GPU)
    tokens, ids, weights, expert_rows = (array.cuda() for array in inputs(94, rank, 64, world,
                                                                          gpu.config.max_recv_tokens(world)))
    gpu.dispatch(tokens, ids, weights)
    gpu.combine(expert_rows, len(ids))
    torch.cuda._sleep(600_000_000)  # clock cycles: about 0.3 s at the 2 GHz of an H100 or H200
    waiting, finished = threading.Event(), threading.Event()
    polls = []  # (answered while synchronize waited, what the poll gave)

    def watchdog():
        torch.cuda.set_device(gpu.device)
        while not finished.is_set():
            before = waiting.is_set()
            try:
                result = gpu.poll_error()
            except rocep.Error as error:
                result = (type(error).__name__, str(error))
            polls.append((before and waiting.is_set(), result))
            time.sleep(0.001)

    thread = threading.Thread(target=watchdog)
    thread.start()
    waiting.set()
    gpu.synchronize()
    waiting.clear()
    finished.set()
    thread.join()
    answered = sum(1 for inside, _ in polls if inside)
    results = {result for _, result in polls}
    if answered < 10 or results != {(0, "")}:
        failures.append(f"watchdog: {answered} polls answered while synchronize waited; they gave {results}")
    # An expert id out of range on rank 0, recorded by the send: poll_error reads it once the stream is
    # done (a RecordedError, true, of kind INVALID_INPUT, naming the slot), and synchronize raises it.
    if rank == 0:
        ids[3, 0] = EXPERTS_PER_RANK * world + 5
    gpu.dispatch(tokens, ids, weights)
    gpu.combine(expert_rows, len(ids))
    torch.cuda.synchronize(gpu.device)
    error = gpu.poll_error()
    expected_kind = rocep.RecordedError.Kind.INVALID_INPUT if rank == 0 else rocep.RecordedError.Kind.NONE
    if not repr(gpu).startswith(f"rocep.Group(rank {rank} of {world}, GPU {gpu.device}, EpConfig("):
        failures.append(f"repr: {gpu!r}")
    if (not isinstance(error, rocep.RecordedError) or error.kind != expected_kind or bool(error) != (rank == 0)
            or (rank == 0 and "token 3, slot 0" not in error.message)):
        failures.append(f"poll_error after an invalid id on rank 0: {error!r}")
    try:
        gpu.synchronize()
        if rank == 0:
            failures.append("synchronize after an invalid id: nothing raised")
    except rocep.InvalidInputError as raised:
        if rank != 0 or "token 3, slot 0" not in str(raised):
            failures.append(f"synchronize after an invalid id: {raised}")


def check_close(boot, rank, world):
    """close() is refused on every rank while the last rank holds a view of the group's input buffer; then
    it releases the group's device memory at once, and later calls raise CallOrderError."""
    gpu = rocep.Group(boot, config_for(world), rocep.Backend.GPU)
    device, held_bytes = gpu.device, gpu.memory_bytes
    view = gpu.dispatch_input_buffer() if rank == world - 1 else None
    try:
        gpu.close()
        failures.append("close: taken while a view of the input buffer lives")
    except rocep.Error as error:
        if f"alive on rank(s) [{world - 1}]" not in str(error):
            failures.append(f"close refused: {error}")
    del view
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info(device)[0]
    gpu.close()
    freed = torch.cuda.mem_get_info(device)[0] - free_before
    if freed < 0.9 * held_bytes:
        failures.append(f"close: {freed} bytes freed on GPU {device}, the group held {held_bytes}")
    try:
        gpu.poll_error()
        failures.append("close: a call after close taken")
    except rocep.CallOrderError:
        pass


def check_torch_on_cpu_reference(boot, rank, world):
    """torch CPU tensors on the CPU reference give the bits that numpy arrays give."""
    cpu = rocep.Group(boot, config_for(world), rocep.Backend.CPU_REFERENCE)
    n = 50
    tokens, ids, weights, expert_rows = inputs(90, rank, n, world, cpu.config.max_recv_tokens(world))
    from_torch = cpu.dispatch(tokens, ids, weights)
    out_torch = cpu.combine(expert_rows, n)
    from_numpy = cpu.dispatch(bits(tokens), ids.numpy(), weights.numpy())
    out_numpy = cpu.combine(bits(expert_rows), n)
    count = from_numpy.count()
    check("torch on cpu num_recv_tokens", from_torch.num_recv_tokens, from_numpy.num_recv_tokens)
    for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
        check(f"torch on cpu {field}", getattr(from_torch, field)[:count], getattr(from_numpy, field)[:count])
    check("torch on cpu combined", out_torch, out_numpy)


def main() -> int:
    global run_seed
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    drawn = [int(os.environ.get("ROCEP_CHECK_SEED", 0)) or secrets.randbelow(2**40) + 1]
    dist.broadcast_object_list(drawn, src=0)
    run_seed = drawn[0]
    if rank == 0:
        print(f"seed {run_seed} (ROCEP_CHECK_SEED={run_seed} repeats these inputs)")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    boot = bootstrap.from_torch()
    for layout, dispatch_format in ((rocep.Layout.PER_TOKEN, rocep.TokenFormat.BF16),
                                    (rocep.Layout.PER_TOKEN, rocep.TokenFormat.FP8_BLOCK128),
                                    (rocep.Layout.EXPANDED, rocep.TokenFormat.BF16)):
        check_native(boot, rank, world, layout, dispatch_format)
    for layout in (rocep.Layout.PER_TOKEN, rocep.Layout.EXPANDED):
        check_native(boot, rank, world, layout, rocep.TokenFormat.BF16, local_only=True)
    check_input_scales(boot, rank, world)
    check_nvfp4_global_scale(boot, rank, world)
    check_mx_formats(boot, rank, world)
    check_native_graph(boot, rank, world)
    check_cupy(boot, rank, world)
    check_input_buffers(boot, rank, world)
    check_quantised_input_buffer(boot, rank, world)
    check_scales_of_odd_strides(boot, rank, world)
    check_epilogue(boot, rank, world)
    check_mori(boot, rank, world, fp8=False)
    check_mori(boot, rank, world, fp8=True)
    check_mori_graph(boot, rank, world)
    check_devices(boot, rank, world)
    check_watchdog(boot, rank, world)
    check_close(boot, rank, world)
    check_torch_on_cpu_reference(boot, rank, world)
    torch.cuda.synchronize()
    all_failures = [None] * world
    dist.all_gather_object(all_failures, failures)
    if rank == 0:
        print("rank failures:", all_failures)
        print("PASSED" if not any(all_failures) else "FAILED")
    dist.barrier()
    dist.destroy_process_group()
    return 1 if any(all_failures) else 0


if __name__ == "__main__":
    sys.exit(main())
