"""The Python package on the CPU reference, at any number of MPI ranks (mpirun -np N python -m pytest):
the native API against a naive numpy computation, the MoRI-shaped op, every bootstrap, and the errors.
Inputs are random and drawn anew per test from a seed shared by the ranks; outputs are allocated fresh."""

import gc
import pathlib
import re
import subprocess
import sys
import threading
import time
import types
import warnings
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import rocep
from rocep import bf16, bootstrap
from rocep.accuracy import calc_diff
from rocep.mori import EpDispatchCombineConfig, EpDispatchCombineOp

COMM = MPI.COMM_WORLD
RANK, WORLD = COMM.Get_rank(), COMM.Get_size()


def shared_seed() -> int:
    return COMM.bcast(int(np.random.SeedSequence().entropy % (2**31)) if RANK == 0 else None, root=0)


def make_config(hidden=256, top_k=4, experts_per_rank=4, max_tokens=24, alignment=4) -> rocep.EpConfig:
    config = rocep.EpConfig()
    config.hidden, config.top_k = hidden, top_k
    config.num_experts, config.max_tokens_per_rank = experts_per_rank * WORLD, max_tokens
    config.expert_alignment = alignment
    return config


def rank_inputs(config, seed, rank, num_tokens=None):
    """Rank `rank`'s tokens (bf16 bits), ids (distinct, some -1) and weights."""
    rng = np.random.default_rng(seed + 7919 * rank)
    n = int(rng.integers(0, config.max_tokens_per_rank + 1)) if num_tokens is None else num_tokens
    tokens = bf16.from_float(rng.uniform(-4, 4, size=(n, config.hidden)))
    ids = np.stack([rng.permutation(config.num_experts)[:config.top_k] for _ in range(n)]).astype(np.int32) \
        if n else np.zeros((0, config.top_k), np.int32)
    ids[rng.random(ids.shape) < 0.2] = -1
    weights = rng.random((n, config.top_k)).astype(np.float32)
    return tokens, ids, weights


def expert_output_rows(config, seed, bound=1.0):
    """A per-token combine's expert outputs: max_recv_tokens(WORLD) random bf16 rows in [-bound, bound)."""
    return bf16.from_float(np.random.default_rng(seed).uniform(-bound, bound,
                                                               (config.max_recv_tokens(WORLD), config.hidden)))


def bootstraps():
    return {
        "mpi4py": lambda: bootstrap.from_mpi4py(COMM),
        "callables": lambda: bootstrap.Callables(RANK, WORLD, COMM.allgather, COMM.Barrier),
    }


@pytest.mark.parametrize("kind", sorted(bootstraps()))
def test_dispatch_and_combine_match_the_naive_definition(kind):
    config = make_config()
    group = rocep.Group(bootstraps()[kind](), config, rocep.Backend.CPU_REFERENCE)
    local = config.num_local_experts(WORLD)
    for call in range(3):  # new data, counts and routing on every call of one group
        seed = shared_seed()
        inputs = [rank_inputs(config, seed, rank, num_tokens=[None, 0, config.max_tokens_per_rank][call])
                  for rank in range(WORLD)]
        result = group.dispatch(*inputs[RANK])
        rows = [(s, t) for s in range(WORLD) for t in range(len(inputs[s][1]))
                if any(i >= 0 and i // local == RANK for i in inputs[s][1][t])]
        assert result.count() == len(rows)
        assert result.tokens.dtype == np.uint16  # bf16 bits
        assert result.tokens.shape == (config.max_recv_tokens(WORLD), config.hidden)
        for row, (s, t) in enumerate(rows):
            assert (result.tokens[row] == inputs[s][0][t]).all()
            assert list(result.src_info[row]) == [s, t, -1]
            ids = inputs[s][1][t]
            expected_ids = np.where((ids >= 0) & (ids // local == RANK), ids - RANK * local, -1)
            assert (result.topk_ids[row] == expected_ids).all()
            assert (result.topk_weights[row] == inputs[s][2][t]).all()
        # sorted_token_ids: each expert's (row, slot) pairs in row order, padded to the alignment.
        sorted_ids, offsets = [], []
        for expert in range(local):
            offsets.append(len(sorted_ids))
            sorted_ids += [row * config.top_k + k for row in range(len(rows)) for k in range(config.top_k)
                           if result.topk_ids[row][k] == expert]
            padding = (offsets[-1] - len(sorted_ids)) % config.expert_alignment
            sorted_ids += [len(result.tokens) * config.top_k] * padding
        offsets.append(len(sorted_ids))
        assert list(result.row_offsets) == offsets
        assert list(result.sorted_token_ids[:len(sorted_ids)]) == sorted_ids
        # Combine: every rank returns, per received row, a row that depends on (itself, source, token).
        rng = np.random.default_rng(seed + 1)
        rows_of = {(r, s, t): bf16.from_float(rng.uniform(-2, 2, config.hidden))
                   for r in range(WORLD) for s in range(WORLD) for t in range(len(inputs[s][1]))}
        expert_outputs = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
        for row, (s, t) in enumerate(rows):
            expert_outputs[row] = rows_of[(RANK, s, t)]
        out = group.combine(expert_outputs, len(inputs[RANK][1]))
        for t, ids in enumerate(inputs[RANK][1]):
            total = np.zeros(config.hidden, np.float32)
            for r in range(WORLD):
                if any(i >= 0 and i // local == r for i in ids):
                    total += bf16.to_float(rows_of[(r, RANK, t)])
            assert (out[t] == bf16.from_float(total)).all(), f"token {t}"


def test_combine_epilogue_writes_into_a_slice_of_a_wider_array():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    local, hidden = config.num_local_experts(WORLD), config.hidden
    for call in range(2):  # new data and epilogue on every call
        seed = shared_seed()
        inputs = [rank_inputs(config, seed, rank) for rank in range(WORLD)]
        group.dispatch(*inputs[RANK])
        rows = [(s, t) for s in range(WORLD) for t in range(len(inputs[s][1]))
                if any(i >= 0 and i // local == RANK for i in inputs[s][1][t])]
        rng = np.random.default_rng(seed + 3)
        rows_of = {(r, s, t): bf16.from_float(rng.uniform(-2, 2, hidden))
                   for r in range(WORLD) for s in range(WORLD) for t in range(len(inputs[s][1]))}
        expert_outputs = np.zeros((config.max_recv_tokens(WORLD), hidden), np.uint16)
        for row, (s, t) in enumerate(rows):
            expert_outputs[row] = rows_of[(RANK, s, t)]
        n = len(inputs[RANK][1])
        mine = np.random.default_rng(seed + 11 + RANK)
        factor = np.float32(mine.uniform(0.5, 2))
        token_factors = mine.uniform(-2, 2, n).astype(np.float32)
        residual = bf16.from_float(mine.uniform(-2, 2, (n, hidden)))
        wide = np.full((max(n, 1), hidden + 8), 0xFFFF, np.uint16)  # out is its first hidden columns
        out = group.combine(expert_outputs, n, out=wide[:, :hidden], factor=float(factor),
                            token_factors=token_factors, residual=residual)
        assert out.shape == (n, hidden)
        for t, ids in enumerate(inputs[RANK][1]):
            total = np.zeros(hidden, np.float32)
            for r in range(WORLD):
                if any(i >= 0 and i // local == r for i in ids):
                    total += bf16.to_float(rows_of[(r, RANK, t)])
            value = total * factor * token_factors[t] + bf16.to_float(residual[t])  # float32, in this order
            assert (wide[t, :hidden] == bf16.from_float(value)).all(), f"call {call} token {t}"
        assert (wide[:, hidden:] == 0xFFFF).all(), "written between the rows"


def test_bad_input_raises_on_its_rank_and_the_peers_complete():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    bad = [(dict(weights=weights.astype(np.float64)), "topk_weights: dtype must be float32, is float64"),
           (dict(tokens=tokens[:, :128]), r"tokens: shape must be \(8, 256\), is \(8, 128\)"),
           (dict(ids=ids.astype(np.float32)), r"topk_ids: dtype must be int32 \(.*\), is float32"),
           (dict(ids=ids.astype(np.uint8)), r"topk_ids: dtype must be int32 \(.*\), is uint8"),
           (dict(weights=weights > 0.5), r"topk_weights: dtype must be float32, is bool \(this rank"),
           (dict(weights=weights.tolist()), "topk_weights: must be an array"),
           (dict(weights=weights.astype(">f4")), "topk_weights: must be an array")]
    for change, message in bad:
        arguments = dict(tokens=tokens, ids=ids, weights=weights)
        arguments.update(change)
        if RANK == 0:
            # This rank took part with zero tokens: the peers receive nothing from it, and complete.
            with pytest.raises(rocep.InvalidInputError, match=message) as raised:
                group.dispatch(arguments["tokens"], arguments["ids"], arguments["weights"])
            assert raised.value.issued  # the next call is combine, not this dispatch again
            out = group.combine(rows, 0)
        else:
            result = group.dispatch(tokens, ids, weights)
            assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
            out = group.combine(rows, len(ids))
        assert out.shape[1] == config.hidden


def test_bad_combine_arguments_raise_on_their_rank_after_it_took_part():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    rows = expert_output_rows(config, seed)
    tokens, ids, weights = rank_inputs(config, seed, RANK, num_tokens=8)
    group.dispatch(tokens, ids, weights)
    expected = group.combine(rows, len(ids)).copy()
    frozen = np.zeros((len(ids), config.hidden), np.uint16)
    frozen.flags.writeable = False
    untouched = np.full((len(ids) + 2, config.hidden), 0x7FC1, np.uint16)  # poison, room for the real count
    for bad, message in ((dict(num_tokens=3), "num_tokens = 3"),
                         (dict(num_tokens=3, out=untouched), "num_tokens = 3"),
                         (dict(num_tokens=3, shared_expert_output=np.ones((3, config.hidden), np.uint16),
                               residual=np.ones((3, config.hidden), np.uint16)), "num_tokens = 3"),
                         (dict(out=np.zeros((2, config.hidden), np.uint16)), "out: shape"),
                         (dict(out=[[0] * config.hidden] * len(ids)), "out: must be a writable array .*is list"),
                         (dict(out=frozen), r"out: must be a writable array .*is ndarray \(read-only\)")):
        group.dispatch(tokens, ids, weights)
        arguments = dict(num_tokens=len(ids))
        if RANK == 0:
            arguments.update(bad)
            with pytest.raises(rocep.InvalidInputError, match=message + ".*went ahead") as raised:
                group.combine(rows, **arguments)
            assert raised.value.issued
        else:  # the peers get their rows, rank 0's included
            assert (group.combine(rows, **arguments) == expected).all()
    assert (untouched == 0x7FC1).all()  # a wrong count writes into the group's own buffer, not the caller's


def test_expert_input_scales_of_a_wrong_dtype_raise_after_taking_part():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE, rocep.Layout.EXPANDED)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=6)
    scales = np.full(config.num_local_experts(WORLD), 0.5, np.float64)
    if RANK == 0:
        with pytest.raises(rocep.InvalidInputError, match="expert_input_scales: dtype must be float32") as raised:
            group.dispatch(tokens, ids, weights, expert_input_scales=scales)
        assert raised.value.issued
        tokens_here = 0
    else:
        result = group.dispatch(tokens, ids, weights)
        assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
        tokens_here = len(ids)
    rows = np.zeros((config.max_recv_rows(WORLD), config.hidden), np.uint16)
    group.combine(rows, tokens_here, row_weights=np.zeros(config.max_recv_rows(WORLD), np.float32))


def test_read_only_inputs_are_taken_and_a_strided_row_of_out_is_refused():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=1)
    rows = expert_output_rows(config, shared_seed())
    writable = group.dispatch(tokens, ids, weights)
    expected = group.combine(rows, 1).copy()
    for array in (tokens, ids, weights, rows):
        array.flags.writeable = False
    frozen = group.dispatch(tokens, ids, weights)
    count = writable.count()
    assert frozen.count() == count and (frozen.src_info[:count] == writable.src_info[:count]).all()
    if RANK == 0:  # refused on this rank before anything is issued; the peers wait until it is repeated
        with pytest.raises(rocep.InvalidInputError, match="each row must be contiguous") as raised:
            group.combine(rows, 1, out=np.zeros((1, 2 * config.hidden), np.uint16)[:, ::2])
        assert not raised.value.issued  # repeat the combine
    assert (group.combine(rows, 1) == expected).all()


def test_outputs_of_an_earlier_call_are_written_again_with_out():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    earlier = rank_inputs(config, shared_seed(), RANK)
    first = group.dispatch(*earlier)
    group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(earlier[1]))
    inputs = rank_inputs(config, shared_seed(), RANK, num_tokens=10)  # rows to share memory with `buffer`
    fresh = group.dispatch(*inputs)
    combined = group.combine(np.ones((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(inputs[1]))
    again = group.dispatch(*inputs, out=first)
    buffer = np.zeros((config.max_tokens_per_rank, config.hidden), np.uint16)
    into = group.combine(np.ones((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(inputs[1]),
                         out=buffer)
    count = fresh.count()
    assert again is first and again.count() == count
    assert (again.tokens[:count] == fresh.tokens[:count]).all()
    assert (again.src_info[:count] == fresh.src_info[:count]).all()
    assert (into == combined).all() and np.shares_memory(into, buffer)


def test_calls_out_of_order_raise_call_order_error_and_the_group_goes_on():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.CallOrderError):
        group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), 0)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=config.max_tokens_per_rank)
    rows = expert_output_rows(config, shared_seed() + RANK, bound=2.0)
    fresh = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    fresh.dispatch(tokens, ids, weights)
    expected = fresh.combine(rows, len(ids)).copy()  # the same step with no refused call before it
    for send in (group.dispatch, group.dispatch_send):
        send(tokens, ids, weights)
        if send == group.dispatch_send:
            group.dispatch_recv()
        # A dispatch refused for its order leaves the last one's tokens as the combine's rows (even when
        # the refused call has fewer).
        with pytest.raises(rocep.CallOrderError):
            group.dispatch(tokens[:1], ids[:1], weights[:1])
        with pytest.raises(rocep.CallOrderError):
            group.dispatch_send(tokens[:1], ids[:1], weights[:1])
        out = group.combine(rows, len(ids))
        assert out.shape == (len(ids), config.hidden) and (out == expected).all()


def test_a_watchdog_thread_polls_while_a_call_is_inside_the_group():
    """poll_error, which any thread may call at any time, is answered while this thread's dispatch is inside
    the group (its bootstrap's all-gather held 0.2 s), and reads what the send recorded before it: an expert
    id out of range on rank 0."""
    config = make_config()
    held, entered = threading.Event(), threading.Event()

    def all_gather(data):
        if held.is_set():
            entered.set()
            time.sleep(0.2)
        return COMM.allgather(data)

    group = rocep.Group(bootstrap.Callables(RANK, WORLD, all_gather, COMM.Barrier), config,
                        rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    if RANK == 0:
        ids[2, 1] = 1000
    polls = []

    def watchdog():
        if entered.wait(timeout=10):
            polls.append(group.poll_error())

    thread = threading.Thread(target=watchdog)
    held.set()
    thread.start()
    group.dispatch(tokens, ids, weights)
    held.clear()
    thread.join()
    assert len(polls) == 1  # the poll raised nothing
    error = polls[0]
    kind, message = error  # still the (kind, message) pair it always was
    if RANK == 0:
        assert error and error.kind == rocep.RecordedError.Kind.INVALID_INPUT and kind == 1
        assert "token 2, slot 1: expert id 1000" in error.message, error.message
        with pytest.raises(rocep.InvalidInputError, match="expert id 1000"):
            group.synchronize()
    else:
        assert not error and error.kind == rocep.RecordedError.Kind.NONE and (kind, message) == (0, "")
    group.combine(expert_output_rows(config, shared_seed()), len(ids))
    assert not group.poll_error() and group.poll_error() == (0, "")


def test_close_is_refused_on_every_rank_while_a_rank_holds_a_buffer_view_and_then_releases_the_group():
    """close() while the last rank holds a view of the group's input buffer: refused on every rank, naming
    that rank, and the group goes on (a step equal to a fresh group's); without the view it is taken, and
    every later call raises CallOrderError."""
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    fresh = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    rows = expert_output_rows(config, shared_seed() + RANK)
    view = group.combine_input_buffer()[1:] if RANK == WORLD - 1 else None
    with pytest.raises(rocep.Error, match=rf"alive on rank\(s\) \[{WORLD - 1}\]"):
        group.close()
    group.dispatch(tokens, ids, weights)
    fresh.dispatch(tokens, ids, weights)
    assert (group.combine(rows, len(ids)) == fresh.combine(rows, len(ids))).all()
    del view
    assert repr(group) == f"rocep.Group(rank {RANK} of {WORLD}, CPU reference, {group.config!r})"
    assert "layout=per-token" in repr(group)  # the group's layout, which replaces the config's
    group.close()
    group.close()  # again: nothing to do
    assert repr(group).startswith(f"rocep.Group(rank {RANK} of {WORLD}, closed, EpConfig(")  # no call made
    for call in (lambda: group.dispatch(tokens, ids, weights), group.poll_error, group.synchronize,
                 group.dispatch_input_buffer, lambda: group.memory_bytes):
        with pytest.raises(rocep.CallOrderError, match=r"closed \(EpGroup::close\(\)\)"):
            call()


def test_close_is_refused_on_every_rank_while_another_thread_is_inside_a_call():
    """close() while a second thread of the last rank is inside a dispatch (its bootstrap's all-gather held
    until close has answered): rocep.CallOrderError on every rank naming that rank, nothing released; the
    dispatch then completes, its step equal to a fresh group's, and close() is taken."""
    config = make_config()
    hold, entered, release = threading.Event(), threading.Event(), threading.Event()

    def all_gather(data):
        if hold.is_set():
            hold.clear()
            entered.set()
            release.wait(timeout=30)
        return COMM.allgather(data)

    group = rocep.Group(bootstrap.Callables(RANK, WORLD, all_gather, COMM.Barrier), config,
                        rocep.Backend.CPU_REFERENCE)
    fresh = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    rows = expert_output_rows(config, shared_seed() + RANK)
    fresh.dispatch(tokens, ids, weights)
    expected = fresh.combine(rows, len(ids)).copy()
    caller, raised = None, []

    def dispatch():
        try:
            group.dispatch(tokens, ids, weights)
        except Exception as error:  # noqa: BLE001 - asserted empty below
            raised.append(error)

    if RANK == WORLD - 1:
        hold.set()
        caller = threading.Thread(target=dispatch)
        caller.start()
        assert entered.wait(timeout=10)
    with pytest.raises(rocep.CallOrderError, match=rf"inside a call of the group on rank\(s\) {WORLD - 1}[ ;]"):
        group.close()
    if caller is None:
        group.dispatch(tokens, ids, weights)
    else:
        release.set()
        caller.join()
    assert raised == []
    assert (group.combine(rows, len(ids)) == expected).all()
    group.close()
    with pytest.raises(rocep.CallOrderError, match=r"closed \(EpGroup::close\(\)\)"):
        group.poll_error()


def test_the_cpu_reference_holds_no_device_memory_on_no_gpu():
    group = rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), rocep.Backend.CPU_REFERENCE)
    assert group.memory_bytes == 0
    assert group.device == -1


def test_bad_config_raises_config_error_naming_the_field():
    config = make_config()
    config.top_k = 0
    with pytest.raises(rocep.ConfigError, match="EpConfig.top_k = 0"):
        rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.ConfigError, match="arrays = 'jax' is invalid: allowed are None, 'torch', 'cupy'"):
        rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), rocep.Backend.CPU_REFERENCE, arrays="jax")


def test_a_bootstrap_outside_its_range_or_out_of_the_all_gathers_order_raises_config_error():
    with pytest.raises(rocep.ConfigError, match=r"^bootstrap.Callables: rank = 2, size = 2 are invalid: allowed "
                                                r"are size >= 1 and rank in \[0, size - 1\]$"):
        bootstrap.Callables(2, 2, COMM.allgather, COMM.Barrier)

    class Claims:
        """A bootstrap of the caller's own that says rank() = `rank`, over COMM's all-gather."""

        def __init__(self, rank):
            self._rank = rank

        def rank(self):
            return self._rank

        def size(self):
            return WORLD

        def all_gather(self, data):
            return b"".join(COMM.allgather(data))

        def barrier(self):
            COMM.Barrier()

    with pytest.raises(rocep.ConfigError, match=rf"^EpGroup: the bootstrap's rank\(\) = -1 and size\(\) = {WORLD} "
                                                r"are invalid"):
        rocep.Group(Claims(-1), make_config(), rocep.Backend.CPU_REFERENCE)
    if WORLD > 1:  # every rank says the next one's number: refused on every rank
        with pytest.raises(rocep.ConfigError, match=rf"^EpGroup: the bytes at place 0 of the bootstrap's all_gather "
                                                    rf"\(of {WORLD}\) come from a rank whose bootstrap says rank\(\) = 1,"):
            rocep.Group(Claims((RANK + 1) % WORLD), make_config(), rocep.Backend.CPU_REFERENCE)
    assert rocep.Group(Claims(RANK), make_config(), rocep.Backend.CPU_REFERENCE).rank == RANK


def test_config_fields_as_keywords_over_the_defaults_or_another_config():
    config = rocep.EpConfig(hidden=256, top_k=4, num_experts=8 * WORLD, layout="per-token")
    assert (config.hidden, config.top_k, config.num_experts, config.layout) == (256, 4, 8 * WORLD,
                                                                                 rocep.Layout.PER_TOKEN)
    assert config.max_tokens_per_rank == rocep.EpConfig().max_tokens_per_rank
    changed = rocep.EpConfig(config, num_sms=24)
    assert (changed.hidden, changed.num_sms, config.num_sms) == (256, 24, rocep.EpConfig().num_sms)
    with pytest.raises(rocep.ConfigError, match=r"^EpConfig has no field 'hiden': its fields are hidden, top_k, "):
        rocep.EpConfig(hiden=7168)
    with pytest.raises(rocep.ConfigError, match=r"^EpConfig has no field 'validate'"):
        rocep.EpConfig(config, validate=1)


def test_enum_arguments_take_their_names_as_strings_and_refuse_others_naming_the_allowed_values():
    """Backend, layout, EpConfig's formats and silu_and_quantize's format: the member or its name in any case
    with '-' for '_'; anything else raises an error naming the argument and every allowed value."""
    group = rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), "cpu-reference", layout="Expanded")
    assert group.backend == rocep.Backend.CPU_REFERENCE and group.config.layout == rocep.Layout.EXPANDED
    config = make_config()
    config.dispatch_format, config.combine_dtype = "fp8-block128", "FP8_BLOCK128"
    assert (config.dispatch_format, config.combine_dtype) == (rocep.TokenFormat.FP8_BLOCK128,
                                                              rocep.CombineDtype.FP8_BLOCK128)
    with pytest.raises(rocep.ConfigError, match=r"^backend = 'cpu' is invalid: allowed are rocep.Backend.AUTO, "
                       r"rocep.Backend.GPU, rocep.Backend.CPU_REFERENCE \(or their names as strings: 'auto', "
                       r"'gpu', 'cpu-reference'\)$"):
        rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), "cpu")
    with pytest.raises(rocep.ConfigError, match=r"^backend = None is invalid"):
        rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), None)
    with pytest.raises(rocep.ConfigError, match=r"^EpConfig.fp8_encoding = 'e5m2' is invalid: allowed are "
                       r"rocep.Fp8Encoding.AUTO, .* 'e4m3fnuz'\)$"):
        config.fp8_encoding = "e5m2"
    with pytest.raises(rocep.ConfigError, match=r"^EpConfig.layout = 1 is invalid"):
        config.layout = 1
    gate_up = bf16.from_float(np.random.default_rng(shared_seed()).standard_normal((2, 256), np.float32))
    by_name, by_member = np.full((2, 128), 0xFFFF, np.uint16), np.full((2, 128), 0xFFFF, np.uint16)
    row_offsets = np.array([0, 2], np.uint32)
    rocep.silu_and_quantize(gate_up, by_name, None, row_offsets, 128, format="bf16")
    rocep.silu_and_quantize(gate_up, by_member, None, row_offsets, 128, format=rocep.TokenFormat.BF16)
    assert (by_name == by_member).all() and not (by_name == 0xFFFF).all()
    with pytest.raises(rocep.InvalidInputError, match=r"^format = 'fp4' is invalid: allowed are "
                       r"rocep.TokenFormat.BF16, .* 'mxfp8'\)$"):
        rocep.silu_and_quantize(gate_up, by_name, None, row_offsets, 128, format="fp4")


def test_mori_shaped_op_matches_the_native_group():
    config = EpDispatchCombineConfig(data_type=np.uint16, rank=RANK, world_size=WORLD, hidden_dim=128,
                                     scale_dim=0, scale_type_size=1, max_token_type_size=4,
                                     max_num_inp_token_per_rank=16, num_experts_per_rank=2,
                                     num_experts_per_token=2)
    op = EpDispatchCombineOp(config, bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)
    native = rocep.Group(bootstrap.from_mpi4py(COMM), make_config(128, 2, 2, 16, 1), rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    tokens, ids, weights = rank_inputs(make_config(128, 2, 2, 16, 1), seed, RANK)
    out, out_weights, out_scales, out_indices, recv_num_token = op.dispatch(tokens, weights, None, ids)
    expected = native.dispatch(tokens, ids, weights)
    count = expected.count()
    assert int(recv_num_token[0]) == count and out_scales is None
    assert (out[:count] == expected.tokens[:count]).all()
    assert (out_weights[:count] == expected.topk_weights[:count]).all()
    local = expected.topk_ids[:count]
    assert (out_indices[:count] == np.where(local >= 0, local + RANK * 2, -1)).all()
    combined, combined_weights = op.combine(out, out_weights, out_indices)
    reference = native.combine(expected.tokens, len(ids))
    assert (combined == reference).all() and (combined_weights == weights).all()


def test_split_calls_give_the_fused_calls_bits():
    config = make_config()
    fused = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    split = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    tokens, ids, weights = rank_inputs(config, seed, RANK)
    expected = fused.dispatch(tokens, ids, weights)
    split.dispatch_send(tokens, ids, weights)
    got = split.dispatch_recv()
    count = expected.count()
    assert got.count() == count
    for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
        assert (getattr(got, field)[:count] == getattr(expected, field)[:count]).all(), field
    rows = bf16.from_float(np.random.default_rng(seed + RANK).uniform(-2, 2, expected.tokens.shape[:1] + (256,)))
    shared = bf16.from_float(np.random.default_rng(seed - RANK).uniform(-2, 2, (len(ids), 256)))
    reference = fused.combine(rows, len(ids), shared)
    split.combine_send(rows, len(ids), shared)
    assert (split.combine_recv() == reference).all()
    with pytest.raises(rocep.CallOrderError):
        split.combine_recv()


def test_silu_matches_numpy_within_one_bf16_step():
    rng = np.random.default_rng(shared_seed() + RANK)
    n = 64
    gate_up = bf16.from_float(rng.uniform(-6, 6, (10, 2 * n)))
    out = np.zeros((10, n), np.uint16)
    rocep.silu_and_quantize(gate_up, out, None, np.array([0, 3, 10], np.uint32), n)
    g, u = bf16.to_float(gate_up[:, :n]).astype(np.float64), bf16.to_float(gate_up[:, n:]).astype(np.float64)
    expected = bf16.from_float((g / (1 + np.exp(-g)) * u).astype(np.float32))
    assert np.abs(out.astype(np.int32) - expected.astype(np.int32)).max() <= 1
    with pytest.raises(rocep.InvalidInputError, match=r"gate_up: shape must be \(any, 128\)"):
        rocep.silu_and_quantize(gate_up[:, :n], out, None, np.array([0, 10], np.uint32), n)
    # A read-only gate_up is read; an out the call could not write whole in place is refused by name, never
    # written into a copy that would take the results away.
    gate_up.flags.writeable = False
    again = np.zeros((10, n), np.uint16)
    rocep.silu_and_quantize(gate_up, again, None, np.array([0, 3, 10], np.uint32), n)
    assert (again == out).all()
    wide = np.zeros((10, 2 * n), np.uint16)
    for bad, message in ((wide[:, :n], "out: must be C-contiguous"), (np.asfortranarray(out), "out: must be C-"),
                         (None, "out: must be a writable array .*NoneType")):
        with pytest.raises(rocep.InvalidInputError, match=message):
            rocep.silu_and_quantize(gate_up, bad, None, np.array([0, 3, 10], np.uint32), n)
    assert not wide.any()


def test_the_moe_layer_example_matches_the_layer_without_ep():
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[2] / "examples" / "moe_layer.py"
    spec = importlib.util.spec_from_file_location("moe_layer", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(bootstrap.from_mpi4py(COMM), seed=shared_seed()) < 1e-4
    # local-only: the same tokens everywhere, an all-reduce of the ranks' outputs
    allreduce = lambda a: COMM.allreduce(a, op=MPI.SUM)  # noqa: E731
    assert example.main(bootstrap.from_mpi4py(COMM), seed=shared_seed(), allreduce=allreduce) < 1e-4


def test_int64_ids_dispatch_as_int32_ids_do():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    as_int32 = group.dispatch(tokens, ids, weights)
    group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(ids))
    as_int64 = group.dispatch(tokens, ids.astype(np.int64), weights)
    count = as_int32.count()
    assert as_int64.count() == count and (as_int64.src_info[:count] == as_int32.src_info[:count]).all()
    assert (as_int64.topk_ids[:count] == as_int32.topk_ids[:count]).all()
    group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(ids))
    # Column-major inputs are taken as their values.
    strided = group.dispatch(np.asfortranarray(tokens), np.asfortranarray(ids), np.asfortranarray(weights))
    assert not np.asfortranarray(weights).flags.c_contiguous and strided.count() == count
    for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
        assert (getattr(strided, field)[:count] == getattr(as_int32, field)[:count]).all(), field
    group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(ids))
    # An id past int32 is an invalid id, reported, not wrapped onto a valid one.
    wide = ids.astype(np.int64)
    wide[0, 0] = 2**32 + int(max(ids[0, 0], 0))
    group.dispatch(tokens, wide, weights)
    group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(ids))
    with pytest.raises(rocep.InvalidInputError, match="expert id"):
        group.synchronize()


def test_expanded_layout_matches_the_naive_definition():
    config = make_config(alignment=1)
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE,
                        layout=rocep.Layout.EXPANDED)
    local = config.num_local_experts(WORLD)
    seed = shared_seed()
    inputs = [rank_inputs(config, seed, rank) for rank in range(WORLD)]
    result = group.dispatch(*inputs[RANK])
    # Rows expert by expert, then by source rank, source token, slot.
    expected = [(s, t, k) for e in range(local) for s in range(WORLD) for t in range(len(inputs[s][1]))
                for k in range(config.top_k) if inputs[s][1][t][k] == RANK * local + e]
    assert result.count() == len(expected)
    assert result.tokens.dtype == np.uint16 and result.tokens.shape == (config.max_recv_rows(WORLD), config.hidden)
    for row, (s, t, k) in enumerate(expected):
        assert list(result.src_info[row]) == [s, t, k]
        assert (result.tokens[row] == inputs[s][0][t]).all()
        assert result.weights[row] == inputs[s][2][t][k]
    # Weighted combine with the expert outputs = each row's own token: out = sum_k w_k * x (per rank,
    # rounded to bf16, then summed over ranks), compared with the naive sum.
    rows = np.zeros((config.max_recv_rows(WORLD), config.hidden), np.uint16)
    rows[:len(expected)] = result.tokens[:len(expected)]
    out = group.combine(rows, len(inputs[RANK][1]), row_weights=result.weights)
    tokens, ids, weights = inputs[RANK]
    for t in range(len(ids)):
        total = np.zeros(config.hidden, np.float32)
        for r in range(WORLD):
            partial = np.zeros(config.hidden, np.float32)
            reached = False
            for k in range(config.top_k):
                if ids[t][k] >= 0 and ids[t][k] // local == r:
                    # a float32 multiply, then an add: within one bf16 step of the reference's fused one
                    partial = np.float32(weights[t][k]) * bf16.to_float(tokens[t]) + partial
                    reached = True
            if reached:
                total += bf16.to_float(bf16.from_float(partial))
        assert np.abs(out[t].astype(np.int32) - bf16.from_float(total).astype(np.int32)).max() <= 1, f"token {t}"
    # Unweighted: every slot's row back, zeros for -1.
    group.dispatch(*inputs[RANK])
    unreduced = group.combine(rows, len(ids))
    assert unreduced.shape == (len(ids), config.top_k, config.hidden)
    for t in range(len(ids)):
        for k in range(config.top_k):
            assert (unreduced[t, k] == (tokens[t] if ids[t][k] >= 0 else 0)).all(), f"token {t} slot {k}"


@pytest.mark.parametrize("layout", [rocep.Layout.PER_TOKEN, rocep.Layout.EXPANDED])
def test_pre_quantised_fp8_tokens_and_float32_scales_travel_unchanged(layout):
    config = make_config(alignment=1)  # expanded rows with no padding between experts
    config.dispatch_format = rocep.TokenFormat.FP8_BLOCK128
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE, layout=layout)
    local, blocks = config.num_local_experts(WORLD), config.hidden // 128
    seed = shared_seed()
    inputs = [rank_inputs(config, seed, rank) for rank in range(WORLD)]
    payloads = [np.random.default_rng(seed + 31 * rank).integers(0, 256, (len(inputs[rank][1]), config.hidden),
                                                                  dtype=np.uint8) for rank in range(WORLD)]
    scales = [np.random.default_rng(seed + 37 * rank).uniform(0.01, 1, (len(inputs[rank][1]), blocks))
              .astype(np.float32) for rank in range(WORLD)]
    _, ids, weights = inputs[RANK]
    result = group.dispatch(payloads[RANK], ids, weights, token_scales=scales[RANK])
    if layout == rocep.Layout.PER_TOKEN:  # a row per received token; scales [P, hidden / 128]
        rows = [(s, t) for s in range(WORLD) for t in range(len(inputs[s][1]))
                if any(i >= 0 and i // local == RANK for i in inputs[s][1][t])]
        capacity, scale_shape = config.max_recv_tokens(WORLD), (config.max_recv_tokens(WORLD), blocks)
        scale_of = lambda row: result.scales[row]  # noqa: E731
    else:  # a row per (token, local expert), expert by expert; scales transposed, [hidden / 128, R]
        rows = [(s, t) for e in range(local) for s in range(WORLD) for t in range(len(inputs[s][1]))
                for k in range(config.top_k) if inputs[s][1][t][k] == RANK * local + e]
        capacity, scale_shape = config.max_recv_rows(WORLD), (blocks, config.max_recv_rows(WORLD))
        scale_of = lambda row: result.scales[:, row]  # noqa: E731
    assert result.count() == len(rows)
    assert result.tokens.dtype == np.uint8 and result.tokens.shape == (capacity, config.hidden)  # fp8 codes
    assert result.scales.dtype == np.float32 and result.scales.shape == scale_shape
    for row, (s, t) in enumerate(rows):
        assert (result.tokens[row] == payloads[s][t]).all()
        assert (scale_of(row) == scales[s][t]).all()
    group.combine(np.zeros((capacity, config.hidden), np.uint16), len(ids),
                  row_weights=None if layout == rocep.Layout.PER_TOKEN else result.weights)


def test_pre_quantised_fp8_tokens_in_the_input_buffer_travel_as_copied_ones():
    config = make_config()
    config.dispatch_format = rocep.TokenFormat.FP8_BLOCK128
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    buffer = group.dispatch_input_buffer()
    row_bytes = rocep.format_input_row_bytes(config.dispatch_format, config.hidden)
    scale_bytes = rocep.format_scale_bytes(config.dispatch_format, config.hidden)
    assert buffer.shape == (config.max_tokens_per_rank, row_bytes) and buffer.dtype == np.uint8
    assert row_bytes % 16 == 0 and row_bytes >= config.hidden + scale_bytes
    rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
    for call in range(2):  # new data each call
        seed = shared_seed()
        _, ids, weights = rank_inputs(config, seed, RANK)
        rng = np.random.default_rng(seed + RANK)
        payload = rng.integers(0, 120, (len(ids), config.hidden)).astype(np.uint8)
        scales = rng.uniform(0.5, 2, (len(ids), config.hidden // 128)).astype(np.float32)
        copied = group.dispatch(payload, ids, weights, token_scales=scales)
        expected = [copied.tokens.copy(), copied.scales.copy(), copied.count()]
        group.combine(rows, len(ids))
        buffer[:len(ids), :config.hidden] = payload
        buffer[:len(ids), config.hidden:config.hidden + scale_bytes] = scales.view(np.uint8)
        in_place = group.dispatch(buffer[:len(ids)], ids, weights)
        count = expected[2]
        assert in_place.count() == count
        assert (in_place.tokens[:count] == expected[0][:count]).all(), f"call {call} tokens"
        assert (in_place.scales[:count] == expected[1][:count]).all(), f"call {call} scales"
        group.combine(rows, len(ids))
    # Every rank sends no tokens from the buffer: nothing arrives anywhere.
    assert group.dispatch(buffer[:0], ids[:0], weights[:0]).count() == 0
    group.combine(rows, 0)
    # The rows hold their scales: with token_scales beside them the rows are read as payloads, of the wrong
    # width, and refused after this rank took part.
    with pytest.raises(rocep.InvalidInputError, match="tokens: shape"):
        group.dispatch(buffer[:len(ids)], ids, weights, token_scales=scales)
    group.combine(rows, 0)


def test_pre_quantised_tokens_of_a_wrong_dtype_raise_after_taking_part():
    config = make_config()
    config.dispatch_format = rocep.TokenFormat.FP8_BLOCK128
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    _, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=4)
    payload = np.zeros((4, config.hidden), np.uint8)
    scales = np.ones((4, config.hidden // 128), np.float32)
    bad = [(dict(token_scales=scales.astype(np.float64)),
            "token_scales: dtype float64 is invalid.*allowed are float32"),
           (dict(tokens=payload.astype(np.int8)), "tokens: dtype int8 is invalid.*allowed are uint8"),
           (dict(token_scales=scales[:, :1]), r"token_scales: shape must be \(4, 2\) \(float32\), is \(4, 1\)")]
    for change, message in bad:
        arguments = dict(tokens=payload, token_scales=scales)
        if RANK == 0:
            arguments.update(change)
            with pytest.raises(rocep.InvalidInputError, match=message):
                group.dispatch(arguments["tokens"], ids, weights, token_scales=arguments["token_scales"])
            group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), 0)
        else:
            result = group.dispatch(payload, ids, weights, token_scales=scales)
            assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
            group.combine(np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16), len(ids))


def test_mori_split_calls_local_expert_count_and_source_positions():
    config = rocep.EpDispatchCombineConfig(data_type=np.uint16, rank=RANK, world_size=WORLD, hidden_dim=128,
                                           scale_dim=0, scale_type_size=1, max_token_type_size=4,
                                           max_num_inp_token_per_rank=16, num_experts_per_rank=2,
                                           num_experts_per_token=2, block_num=64, warp_num_per_block=16)
    op = rocep.EpDispatchCombineOp(config, bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)
    fused = rocep.EpDispatchCombineOp(config, bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    inputs = [rank_inputs(make_config(128, 2, 2, 16, 1), seed, rank) for rank in range(WORLD)]
    tokens, ids, weights = inputs[RANK]
    expected = fused.dispatch(tokens, weights, None, ids, 32, 0, 8)  # MoRI's launch settings, positional
    sent = op.dispatch_send(tokens, weights, None, ids)
    op.dispatch_recv(call_local_expert_count=True)
    count = int(expected[4][0])
    assert int(sent[4][0]) == count
    for got, want in zip(sent[:4], expected[:4]):
        if want is not None:
            assert (got[:count] == want[:count]).all()
    # Per local expert: the (row, slot) pairs naming it, from the naive definition.
    naive = [sum(1 for s in range(WORLD) for token_ids in inputs[s][1] for i in token_ids if i == RANK * 2 + e)
             for e in range(2)]
    assert list(rocep.mori.local_expert_count(config, sent[3], sent[4])) == naive
    assert list(rocep.mori.local_expert_count(config, sent[3], count)) == naive  # the count as an int
    assert list(op.local_expert_count) == naive  # MoRI's call_local_expert_count
    positions = op.get_dispatch_src_token_pos()  # the received rows only, as MoRI's
    rows = [s * 16 + t for s in range(WORLD) for t in range(len(inputs[s][1]))
            if any(i >= 0 and i // 2 == RANK for i in inputs[s][1][t])]
    assert list(positions) == rows
    rows_out = np.zeros((op._group.config.max_recv_tokens(WORLD), 128), np.uint16)
    rows_out[:count] = sent[0][:count]
    want_out, want_weights = fused.combine(rows_out, expected[1], expected[3], 80, 0, 8, -1, False)
    got_out, got_weights = op.combine_send(rows_out, sent[1], sent[3])
    op.combine_recv()
    assert (got_out == want_out).all() and (got_weights == weights).all()
    op.close()  # collective, as the op's creation
    with pytest.raises(rocep.CallOrderError, match=r"closed \(EpGroup::close\(\)\)"):
        op.dispatch(tokens, weights, None, ids)


def local_only_config(config, allreduce_world_size):
    local = rocep.EpConfig(config)
    local.local_only, local.allreduce_world_size = True, allreduce_world_size
    return local


@pytest.mark.parametrize("layout", [rocep.Layout.PER_TOKEN, rocep.Layout.EXPANDED])
def test_local_only_outputs_summed_over_ranks_equal_the_all_to_all_result(layout):
    # Attention run tensor-parallel over the whole group: every rank holds the same tokens (rank 0's draw).
    config = make_config(alignment=1)
    seed = shared_seed()
    tokens, ids, weights = rank_inputs(config, seed, 0, num_tokens=20)
    boot = bootstrap.from_mpi4py(COMM)
    full = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE, layout)
    local = rocep.Group(boot, local_only_config(config, WORLD), rocep.Backend.CPU_REFERENCE, layout)
    rng = np.random.default_rng(seed + 1)
    # Rank r's experts turn token t into value[r][t] (the same whichever rank sent it: every rank sent t).
    value = bf16.from_float(rng.uniform(-2, 2, (WORLD, len(ids), config.hidden)))
    shared = bf16.from_float(rng.uniform(-1, 1, (len(ids), config.hidden)))
    expanded = layout == rocep.Layout.EXPANDED

    def combine(group, received, **shared_expert):
        """The received rows' expert outputs combined (expanded: weighted by the dispatch's weights)."""
        capacity = config.max_recv_rows(WORLD) if expanded else config.max_recv_tokens(WORLD)
        rows = np.zeros((capacity, config.hidden), np.uint16)
        count = received.count()
        rows[:count] = value[RANK][received.src_info[:count, 1]]
        return group.combine(rows, len(ids), row_weights=received.weights if expanded else None, **shared_expert)

    received = local.dispatch(tokens, ids, weights)
    count = received.count()
    assert (received.src_info[:count, 0] == RANK).all()  # nothing crossed ranks
    mine = [t for t in range(len(ids)) if any(i >= 0 and i // config.num_local_experts(WORLD) == RANK
                                              for i in ids[t])]
    assert sorted(set(received.src_info[:count, 1])) == mine
    local_out = combine(local, received)
    expected = combine(full, full.dispatch(tokens, ids, weights))
    # The caller's all-reduce, in float32 over the ranks in ascending order, rounded once.
    summed = bf16.from_float(sum(bf16.to_float(out) for out in COMM.allgather(local_out)))
    assert (summed == expected).all()

    # The shared expert: added on this rank's slice of the tokens only, so each token gets it once in all.
    with_shared = combine(local, local.dispatch(tokens, ids, weights), shared_expert_output=shared)
    first, last = len(ids) * RANK // WORLD, len(ids) * (RANK + 1) // WORLD
    for t in range(len(ids)):
        own = bf16.to_float(local_out[t])  # this rank's own rows, rounded once
        want = bf16.from_float(own + bf16.to_float(shared[t])) if first <= t < last else local_out[t]
        assert (with_shared[t] == want).all(), f"token {t}"

    # A residual would be added by every rank of the all-reduce: refused there with nothing issued, and the
    # call repeated without it completes. With one rank there is no all-reduce to count it twice.
    received = local.dispatch(tokens, ids, weights)
    residual = bf16.from_float(rng.uniform(-1, 1, (len(ids), config.hidden)))
    if WORLD > 1:
        with pytest.raises(rocep.InvalidInputError,
                           match=rf"residual in local-only mode.*allreduce_world_size = {WORLD} times") as refused:
            combine(local, received, residual=residual)
        assert not refused.value.issued
        assert (combine(local, received) == local_out).all()
    else:
        combine(local, received, residual=residual)


def test_local_only_needs_a_dividing_allreduce_world_size_and_is_refused_off_local_only():
    config = make_config()
    with pytest.raises(rocep.ConfigError, match="EpConfig.allreduce_world_size = 2"):
        bad = rocep.EpConfig(config)
        bad.allreduce_world_size = 2
        rocep.Group(bootstrap.from_mpi4py(COMM), bad, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.ConfigError, match=f"EpConfig.allreduce_world_size = {WORLD + 1}"):
        rocep.Group(bootstrap.from_mpi4py(COMM), local_only_config(config, WORLD + 1), rocep.Backend.CPU_REFERENCE)


def e4m3fn_magnitudes() -> np.ndarray:
    """The finite non-negative e4m3fn values in code order (codes 0x00..0x7e): bias 7, subnormals below 2^-6."""
    codes = np.arange(0x7f)
    exponent, mantissa = codes >> 3, (codes & 7).astype(np.float64)
    return np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0**(exponent - 7)).astype(np.float32)


def e4m3fn_codes(values: np.ndarray) -> np.ndarray:
    """float32 values as e4m3fn codes (uint8): the magnitude rounded to nearest even among the finite values
    and saturated, the sign in bit 7. A naive model, independent of the library's codec."""
    table = e4m3fn_magnitudes()
    magnitude = np.abs(values)
    above = np.clip(np.searchsorted(table, magnitude), 1, len(table) - 1)
    below = above - 1
    to_below, to_above = magnitude - table[below], table[above] - magnitude
    code = np.where((to_below < to_above) | ((to_below == to_above) & (below % 2 == 0)), below, above)
    code = np.where(magnitude >= table[-1], len(table) - 1, code)
    return (code | (np.signbit(values).astype(np.int64) << 7)).astype(np.uint8)


def fp8_block128_round_trip(values: np.ndarray) -> np.ndarray:
    """float32 values quantised to e4m3fn block-128 and dequantised, as include/rocep/formats.hpp defines it:
    scale = max(amax, 1e-4) / 448, element = e4m3fn(x * (448 / max(amax, 1e-4))) rounded to nearest even and
    saturated, value = element * scale, all in float32. A naive model, independent of the library's codec."""
    table = e4m3fn_magnitudes()
    out = np.empty_like(values)
    for first in range(0, len(values), 128):
        x = values[first:first + 128]
        amax = np.maximum(np.abs(x).max(), np.float32(1e-4))
        code = e4m3fn_codes(x * (np.float32(448) / amax)) & 0x7f
        out[first:first + 128] = np.copysign(table[code], x) * (amax / np.float32(448))
    return out


def test_expert_input_scales_quantise_each_row_with_its_experts_scale():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE, rocep.Layout.EXPANDED)
    rows, local = config.max_recv_rows(WORLD), config.num_local_experts(WORLD)
    seed = shared_seed()
    inputs = [rank_inputs(config, seed, rank) for rank in range(WORLD)]
    n = len(inputs[RANK][1])
    plain = group.dispatch(*inputs[RANK])
    group.combine(np.zeros((rows, config.hidden), np.uint16), n, row_weights=plain.weights)
    scales = np.random.default_rng(seed + 5 + RANK).uniform(0.05, 4, local).astype(np.float32)
    scaled = group.dispatch(*inputs[RANK], expert_input_scales=scales)
    codes = scaled.input_scaled_tokens()
    assert codes.shape == (rows, config.hidden) and codes.dtype == np.uint8
    used = plain.count()
    assert (scaled.row_offsets == plain.row_offsets).all()
    assert (scaled.src_info[:used] == plain.src_info[:used]).all()
    for expert in range(local):
        for row in range(plain.row_offsets[expert], plain.row_offsets[expert + 1]):
            x = bf16.to_float(plain.tokens[row])
            want = np.zeros_like(codes[row]) if plain.src_info[row][0] < 0 else e4m3fn_codes(x / scales[expert])
            assert (codes[row] == want).all(), f"row {row}, local expert {expert}"
    group.combine(np.zeros((rows, config.hidden), np.uint16), n, row_weights=scaled.weights)
    # The per-token layout refuses them (every rank here, so none waits), and the group goes on.
    per_token = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.InvalidInputError, match="expert_input_scales"):
        per_token.dispatch(*inputs[RANK], expert_input_scales=scales)
    per_token.dispatch(*inputs[RANK])


def test_fp8_combine_matches_its_definition_and_stays_close_to_the_bf16_combine():
    config = make_config()
    fp8_config = rocep.EpConfig(config)
    fp8_config.combine_dtype = rocep.CombineDtype.FP8_BLOCK128
    boot = bootstrap.from_mpi4py(COMM)
    groups = [rocep.Group(boot, c, rocep.Backend.CPU_REFERENCE) for c in (config, fp8_config)]
    local = config.num_local_experts(WORLD)
    seed = shared_seed()
    inputs = [rank_inputs(config, seed, rank, num_tokens=16) for rank in range(WORLD)]
    rng = np.random.default_rng(seed + 1)
    rows_of = {(r, s, t): bf16.from_float(rng.standard_normal(config.hidden))
               for r in range(WORLD) for s in range(WORLD) for t in range(16)}
    outs = []
    for group in groups:
        received = group.dispatch(*inputs[RANK])
        rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
        for row in range(received.count()):
            source, token = received.src_info[row, :2]
            rows[row] = rows_of[(RANK, source, token)]
        outs.append(group.combine(rows, 16))
    bf16_out, fp8_out = outs
    ids = inputs[RANK][1]
    for t in range(16):
        total = np.zeros(config.hidden, np.float32)
        for r in range(WORLD):  # ascending; another rank's row crossed in fp8, this rank's own stayed bf16
            if any(i >= 0 and i // local == r for i in ids[t]):
                row = bf16.to_float(rows_of[(r, RANK, t)])
                total += row if r == RANK else fp8_block128_round_trip(row)
        assert (fp8_out[t] == bf16.from_float(total)).all(), f"token {t}"
    assert calc_diff(bf16.to_float(fp8_out), bf16.to_float(bf16_out)) < 2e-3


def test_tokens_and_expert_outputs_in_the_groups_buffers_give_the_bits_of_copies():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    tokens_buffer, rows_buffer = group.dispatch_input_buffer(), group.combine_input_buffer()
    assert tokens_buffer.shape == (config.max_tokens_per_rank, config.hidden)
    assert rows_buffer.shape == (config.max_recv_tokens(WORLD), config.hidden)
    for call in range(2):  # new data each call
        seed = shared_seed()
        tokens, ids, weights = rank_inputs(config, seed, RANK)
        rows = bf16.from_float(np.random.default_rng(seed + RANK).uniform(-2, 2, rows_buffer.shape))
        copied = group.dispatch(tokens, ids, weights)
        expected = group.combine(rows, len(ids))
        tokens_buffer[:len(ids)] = tokens
        in_place = group.dispatch(tokens_buffer[:len(ids)], ids, weights)
        count, used = copied.count(), int(copied.row_offsets[-1])
        assert in_place.count() == count and (in_place.row_offsets == copied.row_offsets).all()
        for field in ("tokens", "topk_ids", "topk_weights", "src_info"):
            assert (getattr(in_place, field)[:count] == getattr(copied, field)[:count]).all(), f"call {call} {field}"
        assert (in_place.sorted_token_ids[:used] == copied.sorted_token_ids[:used]).all()
        rows_buffer[:] = rows
        assert (group.combine(rows_buffer, len(ids)) == expected).all(), f"call {call} combined"
    # The array is the group's own memory: one row in, it is refused as misplaced, after this rank took
    # part with zero tokens. (The module takes expert outputs of exactly max_recv_tokens rows, so a combine
    # cannot be handed the combine buffer one row in.)
    with pytest.raises(rocep.InvalidInputError, match="dispatch_input_buffer"):
        group.dispatch(tokens_buffer[1:], *rank_inputs(config, shared_seed(), RANK, tokens_buffer.shape[0] - 1)[1:])
    fp8 = make_config()
    fp8.dispatch_format, fp8.combine_dtype = rocep.TokenFormat.FP8_BLOCK128, rocep.CombineDtype.FP8_BLOCK128
    fp8_group = rocep.Group(bootstrap.from_mpi4py(COMM), fp8, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.ConfigError, match="combine_dtype"):
        fp8_group.combine_input_buffer()
    expanded = rocep.Group(bootstrap.from_mpi4py(COMM), make_config(), rocep.Backend.CPU_REFERENCE,
                           rocep.Layout.EXPANDED)
    with pytest.raises(rocep.ConfigError, match="per-token"):
        expanded.combine_input_buffer()
    # A view keeps its group (and so its memory) alive after the caller dropped it.
    dropped = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    kept, alive = dropped.dispatch_input_buffer(), weakref.ref(dropped)
    del dropped
    gc.collect()
    assert alive() is not None
    del kept
    gc.collect()
    assert alive() is None
    without = make_config()
    without.combine_input_buffer = False
    without_group = rocep.Group(bootstrap.from_mpi4py(COMM), without, rocep.Backend.CPU_REFERENCE)
    with pytest.raises(rocep.ConfigError, match="combine_input_buffer = false"):
        without_group.combine_input_buffer()


def test_arguments_that_are_no_arrays_raise_after_taking_part():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=8)
    many = rank_inputs(config, shared_seed(), RANK, num_tokens=config.max_tokens_per_rank + 1)
    bad = [(dict(tokens=None), "tokens: must be an array .*is NoneType"),
           (dict(ids=None), "topk_ids: must be an array .*is NoneType"),
           (dict(weights=None), "topk_weights: must be an array .*is NoneType"),
           (dict(ids=np.int32(1)), r"topk_ids: must have 2 dimensions, has 0"),
           (dict(weights=weights[:, 0]), r"topk_weights: must have 2 dimensions, has 1"),
           (dict(tokens=many[0], ids=many[1], weights=many[2]),
            "topk_ids: 25 rows .tokens., allowed are at most max_tokens_per_rank = 24")]
    for change, message in bad:
        arguments = dict(tokens=tokens, ids=ids, weights=weights)
        for split in (False, True):
            if RANK == 0:
                arguments.update(change)
                with pytest.raises(rocep.InvalidInputError, match=message + r".*took part with zero tokens"):
                    if split:
                        group.dispatch_send(arguments["tokens"], arguments["ids"], arguments["weights"])
                    else:
                        group.dispatch(arguments["tokens"], arguments["ids"], arguments["weights"])
                if split:
                    group.dispatch_recv()
                group.combine(rows, 0)
            else:
                if split:
                    group.dispatch_send(tokens, ids, weights)
                    result = group.dispatch_recv()
                else:
                    result = group.dispatch(tokens, ids, weights)
                assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
                group.combine(rows, len(ids))


def test_strided_scales_are_taken_and_missing_ids_beside_scales_raise_after_taking_part():
    config = make_config()
    config.dispatch_format = rocep.TokenFormat.FP8_BLOCK128
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    _, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=4)
    rng = np.random.default_rng(shared_seed() + RANK)
    payload = rng.integers(0, 120, (4, config.hidden)).astype(np.uint8)
    scales = rng.uniform(0.5, 2, (4, config.hidden // 128)).astype(np.float32)
    rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
    contiguous = group.dispatch(payload, ids, weights, token_scales=scales)
    expected = [contiguous.tokens.copy(), contiguous.scales.copy(), contiguous.count()]
    group.combine(rows, 4)
    column_major = group.dispatch(payload, ids, weights, token_scales=np.asfortranarray(scales))
    assert column_major.count() == expected[2]
    assert (column_major.tokens[:expected[2]] == expected[0][:expected[2]]).all()
    assert (column_major.scales[:expected[2]] == expected[1][:expected[2]]).all()
    group.combine(rows, 4)
    if RANK == 0:
        with pytest.raises(rocep.InvalidInputError, match="topk_ids: must be an array .*NoneType"):
            group.dispatch(payload, None, weights, token_scales=scales)
        group.combine(rows, 0)
    else:
        result = group.dispatch(payload, ids, weights, token_scales=scales)
        assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
        group.combine(rows, 4)


# Scaled formats: (format, elements per payload byte, scale dtype, elements per scale).
SCALED_OUTPUTS = [(rocep.TokenFormat.FP8_BLOCK128, 1, np.float32, 128), (rocep.TokenFormat.MXFP8, 1, np.uint8, 32),
                  (rocep.TokenFormat.MXFP4, 2, np.uint8, 32), (rocep.TokenFormat.NVFP4, 2, np.uint8, 16)]


@pytest.mark.parametrize("format_, per_byte, scale_dtype, block", SCALED_OUTPUTS)
def test_scaled_outputs_come_as_arrays_of_their_elements_in_both_layouts(format_, per_byte, scale_dtype, block):
    config = make_config(alignment=1)
    config.dispatch_format = format_
    per_token = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    expanded = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE,
                           layout=rocep.Layout.EXPANDED)
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK)
    extra = {"global_scale": np.array([448 * 6 / 4], np.float32)} if format_ == rocep.TokenFormat.NVFP4 else {}
    hidden, tokens_p, rows_r = config.hidden, config.max_recv_tokens(WORLD), config.max_recv_rows(WORLD)
    by_token = per_token.dispatch(tokens, ids, weights, **extra)
    per_token.combine(np.zeros((tokens_p, hidden), np.uint16), len(ids))
    by_expert = expanded.dispatch(tokens, ids, weights, **extra)
    expanded.combine(np.zeros((rows_r, hidden), np.uint16), len(ids), row_weights=by_expert.weights)
    assert by_token.tokens.dtype == np.uint8 and by_token.tokens.shape == (tokens_p, hidden // per_byte)
    assert by_token.scales.dtype == scale_dtype and by_token.scales.shape == (tokens_p, hidden // block)
    assert by_expert.tokens.dtype == np.uint8 and by_expert.tokens.shape == (rows_r, hidden // per_byte)
    assert by_expert.scales.dtype == scale_dtype
    tensor_bytes = rocep.format_scale_tensor_bytes(format_, rows_r, hidden)
    expanded_shape = {rocep.TokenFormat.FP8_BLOCK128: (hidden // block, rows_r),
                      rocep.TokenFormat.NVFP4: (tensor_bytes,)}.get(format_, (rows_r, hidden // block))
    assert by_expert.scales.shape == expanded_shape
    # Each expanded row holds its token's codes and scales, as the token's per-token row does.
    row_of = {(s, t): row for row, (s, t, _) in enumerate(by_token.src_info[:by_token.count()])}
    assert by_expert.count() > 0 or by_token.count() == 0
    for row, (s, t, _) in enumerate(by_expert.src_info[:by_expert.count()]):
        token_row = row_of[(s, t)]
        assert (by_expert.tokens[row] == by_token.tokens[token_row]).all()
        if format_ == rocep.TokenFormat.FP8_BLOCK128:
            assert (by_expert.scales[:, row] == by_token.scales[token_row]).all()
        elif format_ != rocep.TokenFormat.NVFP4:  # nvfp4's swizzled tiles: formats.hpp
            assert (by_expert.scales[row] == by_token.scales[token_row]).all()


def e4m3fn_to_float(codes):
    codes = codes.astype(np.int32)
    exponent, mantissa = (codes >> 3) & 0xF, (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0**(exponent - 7))
    return np.where(codes & 0x80, -magnitude, magnitude)


def test_nvfp4_dispatch_of_bf16_tokens_takes_a_global_scale():
    config = make_config()
    config.dispatch_format = rocep.TokenFormat.NVFP4
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    inputs = [rank_inputs(config, seed, rank, num_tokens=6) for rank in range(WORLD)]
    tokens, ids, weights = inputs[RANK]
    amax = max(np.abs(bf16.to_float(t)).max() for t, _, _ in inputs)
    global_scale = np.array([448 * 6 / amax], np.float32)
    rows = np.zeros((config.max_recv_tokens(WORLD), config.hidden), np.uint16)
    if RANK == 0:
        with pytest.raises(rocep.InvalidInputError, match="global_scale"):
            group.dispatch(tokens, ids, weights)
        group.combine(rows, 0)
    else:
        result = group.dispatch(tokens, ids, weights, global_scale=global_scale)
        assert not (result.src_info[:result.count(), 0] == 0).any()  # nothing from rank 0
        group.combine(rows, 6)
    for split in (False, True):
        if split:
            group.dispatch_send(tokens, ids, weights, global_scale=global_scale)
            result = group.dispatch_recv()
        else:
            result = group.dispatch(tokens, ids, weights, global_scale=global_scale)
        count = result.count()
        assert count > 0
        codes = np.stack([result.tokens[:count] & 0xF, result.tokens[:count] >> 4], axis=2).reshape(count, -1)
        e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6] * 2) * np.repeat([1, -1], 8)
        block_scales = np.repeat(e4m3fn_to_float(result.scales[:count]), 16, axis=1)
        received = e2m1[codes] * block_scales / global_scale[0]
        sent = np.stack([bf16.to_float(inputs[r][0][t]) for r, t, _ in result.src_info[:count]])
        assert calc_diff(received, sent) < 0.02
        group.combine(rows, 6)


def mori_config(**change):
    fields = dict(data_type=np.uint16, rank=RANK, world_size=WORLD, hidden_dim=128, scale_dim=0, scale_type_size=1,
                  max_token_type_size=4, max_num_inp_token_per_rank=16, num_experts_per_rank=2,
                  num_experts_per_token=2)
    fields.update(change)
    return EpDispatchCombineConfig(**fields)


def test_mori_config_errors_raise_on_every_rank_in_the_configs_names():
    cases = [(dict(data_type=np.float32), "data_type = .*float32.* is invalid: allowed are torch.bfloat16"),
             (dict(num_experts_per_token=0), "EpDispatchCombineConfig.num_experts_per_token = 0"),
             (dict(max_num_inp_token_per_rank=0), "EpDispatchCombineConfig.max_num_inp_token_per_rank = 0")]
    if WORLD > 1:  # every rank says it is rank 0: the others are wrong, and every rank raises
        cases.append((dict(rank=0), "rank = 0, world_size = .*, but the bootstrap says rank [1-9]"))
    # A field of the wrong type on the last rank only (a float, None, past 32 bits): ConfigError on every rank
    # naming it, where a rank that raised alone would leave the others waiting in the group's creation.
    last = dict(num_experts_per_rank=4 / 2, hidden_dim=None, max_num_inp_token_per_rank=2**31)
    for field, value in last.items():
        change = {field: value} if RANK == WORLD - 1 else {}
        cases.append((change, rf"EpDispatchCombineConfig.{field} = {re.escape(repr(value))} is invalid: must be an"))
    for change, message in cases:
        with pytest.raises(rocep.ConfigError, match=message):
            EpDispatchCombineOp(mori_config(**change), bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)
    EpDispatchCombineOp(mori_config(), bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)  # still works


def test_mori_dispatch_refused_on_a_rank_names_its_arguments_and_its_combine_returns_no_weights():
    op = EpDispatchCombineOp(mori_config(), bootstrap.from_mpi4py(COMM), rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(make_config(128, 2, 2, 16, 1), shared_seed(), RANK, num_tokens=4)
    out, out_weights, _, out_indices, _ = op.dispatch(tokens, weights, None, ids)
    assert op.combine(out, out_weights, out_indices)[1].shape == (4, 2)
    if RANK == 0:
        with pytest.raises(rocep.InvalidInputError, match=r"weights: dtype must be float32.*zero tokens"):
            op.dispatch(tokens, weights.astype(np.float64), None, ids)
        combined, combined_weights = op.combine(out, out_weights, out_indices)
        assert combined.shape[0] == 0 and combined_weights.shape == (0, 2)
    else:
        out, out_weights, _, out_indices, _ = op.dispatch(tokens, weights, None, ids)
        assert op.combine(out, out_weights, out_indices)[1].shape == (4, 2)
    # Too many tokens, in the config's name; a combine refused names the op's input; an id out of range is
    # recorded for the op's poll_error and synchronize.
    with pytest.raises(rocep.InvalidInputError, match=r"at most max_num_inp_token_per_rank = 16"):
        op.dispatch(np.concatenate([tokens] * 5), np.concatenate([weights] * 5), None, np.concatenate([ids] * 5))
    with pytest.raises(rocep.InvalidInputError, match=r"\binput: shape must be"):
        op.combine(out[:1], out_weights, out_indices)
    op.combine(out, out_weights, out_indices)  # the refused combine repeated
    bad_ids = ids.copy()
    bad_ids[1, 0] = 1000
    out, out_weights, _, out_indices, _ = op.dispatch(tokens, weights, None, bad_ids)
    op.combine(out, out_weights, out_indices)
    error = op.poll_error()
    assert error and error.kind == rocep.RecordedError.Kind.INVALID_INPUT and "expert id 1000" in error.message
    with pytest.raises(rocep.InvalidInputError, match="expert id 1000"):
        op.synchronize()


def test_combine_refused_for_its_expert_outputs_says_how_many_rows_and_may_be_repeated():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    seed = shared_seed()
    rows = expert_output_rows(config, seed)
    tokens, ids, weights = rank_inputs(config, seed, RANK, num_tokens=5)
    received = group.dispatch(tokens, ids, weights)
    if RANK == 0:
        with pytest.raises(rocep.InvalidInputError, match=r"expert_outputs: shape must be .*rows: max_recv_tokens"
                                                          r".*refused on this rank, nothing issued"):
            group.combine(rows[:received.count()], 5)
    out = group.combine(rows, 5)  # the repeated call completes with the peers'
    assert out.shape == (5, config.hidden)


def test_build_info_gives_the_packages_version_and_what_it_was_built_for():
    info = rocep.build_info()
    pyproject = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'\nversion = "{info["version"]}"\n' in pyproject  # CMake's project() version is the package's
    assert rocep.__version__ == info["version"]
    assert info["gpu_platform"] in ("amd", "nvidia", "none")
    assert info["shmem_engine"] in ("nvshmem", "rocshmem", "none")
    assert info["profiler_ranges"] in ("nvtx", "roctx", "none")
    assert (info["gpu_architectures"] == "") == (info["gpu_platform"] == "none")


def test_a_bootstrap_that_fails_raises_bootstrap_error_at_creation_and_in_calls():
    """A bootstrap whose all_gather raises from its n-th call on (a store that is gone): rocep.BootstrapError
    naming the rank, the collective and the bootstrap's own error, at each of creation's all-gathers and in
    the CPU reference's dispatch, which moves its messages through the bootstrap. One rank of its own."""
    config = make_config()
    tokens, ids, weights = rank_inputs(config, shared_seed(), 0, num_tokens=3)
    created = False
    for first_failing in range(1, 16):
        calls = []

        def all_gather(data):
            calls.append(data)
            if len(calls) >= first_failing:
                raise RuntimeError("the store is gone")
            return [data]

        with pytest.raises(rocep.BootstrapError,
                           match=r"EpGroup: rank 0: the bootstrap's all_gather failed: (.|\n)*the store is gone"):
            group = rocep.Group(bootstrap.Callables(0, 1, all_gather, lambda: None), config,
                                rocep.Backend.CPU_REFERENCE)
            created = True
            group.dispatch(tokens, ids, weights)
        if created:
            break
    assert created


def test_a_result_kept_for_out_does_not_keep_its_group_alive():
    """A server keeps a DispatchResult for out=; its group still goes with its last reference (its memory,
    its bootstrap), and a failing bootstrap in close() raises BootstrapError with the group still open."""
    config = make_config()
    boot = bootstrap.Callables(0, 1, lambda data: [data], lambda: None)  # a group of its own on each rank
    group = rocep.Group(boot, config, rocep.Backend.CPU_REFERENCE)
    tokens, ids, weights = rank_inputs(config, shared_seed(), 0, num_tokens=4)
    result = group.dispatch(tokens, ids, weights)
    held = weakref.ref(boot)
    del group, boot
    gc.collect()
    assert held() is None and result.count() > 0

    failing = [False]

    def all_gather(data):
        if failing[0]:
            raise RuntimeError("the store is gone")
        return [data]

    group = rocep.Group(bootstrap.Callables(0, 1, all_gather, lambda: None), config, rocep.Backend.CPU_REFERENCE)
    failing[0] = True
    with pytest.raises(rocep.BootstrapError, match="rank 0: the bootstrap's all_gather failed: RuntimeError"):
        group.close()
    failing[0] = False
    group.dispatch(tokens, ids, weights)  # still open
    group.close()


def test_a_groups_config_is_a_copy_fixed_at_creation():
    config = make_config()
    group = rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE)
    group.config.hidden, group.config.layout = 2 * config.hidden, "expanded"  # each on a copy: no effect
    assert group.config.hidden == config.hidden and group.config.layout == rocep.Layout.PER_TOKEN
    tokens, ids, weights = rank_inputs(config, shared_seed(), RANK, num_tokens=5)
    received = group.dispatch(tokens, ids, weights)
    assert received.tokens.shape == (config.max_recv_tokens(WORLD), config.hidden)
    assert group.combine(expert_output_rows(config, shared_seed()), len(ids)).shape == (5, config.hidden)


def test_a_bare_import_gives_every_public_name_and_submodule():
    # In a fresh interpreter: this module's own imports would otherwise have bound the submodules already.
    probe = ("import rocep\n"
             "missing = [name for name in rocep.__all__ if not hasattr(rocep, name)]\n"
             "assert not missing, missing\n"
             "rocep.bootstrap.Callables(0, 1, lambda data: [data], lambda: None)\n"
             "assert rocep.bf16.to_float(rocep.bf16.from_float([1.5]))[0] == 1.5\n"
             "assert rocep.accuracy.calc_diff([1.0], [1.0]) == 0\n")
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr


def test_a_build_without_gpu_platform_warns_when_auto_leaves_a_gpu_that_torch_sees_unused(monkeypatch):
    if rocep.build_info()["gpu_platform"] != "none":
        pytest.skip("this build has a GPU platform: Backend.AUTO takes the GPU wherever there is one")
    config = make_config()
    # No torch: nothing to warn of.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rocep.Group(bootstrap.from_mpi4py(COMM), config).close()
    # A torch that sees a GPU: the group runs on the CPU reference, and says why, unless asked for it.
    seeing_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", seeing_torch)
    with pytest.warns(RuntimeWarning, match="no GPU platform"):
        group = rocep.Group(bootstrap.from_mpi4py(COMM), config)
    assert group.backend == rocep.Backend.CPU_REFERENCE
    group.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rocep.Group(bootstrap.from_mpi4py(COMM), config, rocep.Backend.CPU_REFERENCE).close()
