"""The fp8 block-128 combine's accuracy against the bf16 combine (EpConfig.combine_dtype), on the CPU
reference, which defines both bit for bit: calc_diff (1 - 2xy / (x^2 + y^2), DeepEP's measure) of the
combined tokens, per-token layout and weighted expanded layout, on expert outputs drawn from a normal
distribution and on the same rows with outliers (one element in 1000 scaled by 100).

    mpirun -np 2 python bench/combine_accuracy.py [--tokens=256] [--hidden=7168] [--top-k=8] [--experts=256]
                                                  [--seed=N]

The inputs are drawn from a seed that the header prints (--seed repeats them).
"""

import argparse
import sys

import numpy as np
from mpi4py import MPI

import rocep
from rocep import bf16, bootstrap
from rocep.accuracy import calc_diff


def combined(config, layout, tokens, ids, weights, outputs_of, combine_dtype):
    """This rank's combined tokens (float32) with each received row's expert output given by outputs_of."""
    config = rocep.EpConfig(config)
    config.combine_dtype = combine_dtype
    group = rocep.Group(bootstrap.from_mpi4py(MPI.COMM_WORLD), config, rocep.Backend.CPU_REFERENCE, layout)
    received = group.dispatch(tokens, ids, weights)
    count = received.count()
    rows = np.zeros((len(received.tokens), config.hidden), np.uint16)
    rows[:count] = outputs_of(received.src_info[:count])
    expanded = layout == rocep.Layout.EXPANDED
    out = group.combine(rows, len(ids), row_weights=received.weights if expanded else None)
    return bf16.to_float(out)


def positive(text: str) -> int:
    value = int(text)  # argparse reports a ValueError as an invalid int
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid: allowed are integers >= 1")
    return value


class Once(argparse.Action):
    """A flag that may be given once: a second one is an error, not a silent override."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in getattr(namespace, "_given", set()):
            parser.error(f"{option_string} is given twice")
        namespace._given = getattr(namespace, "_given", set()) | {option_string}
        setattr(namespace, self.dest, values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokens", type=positive, default=256, action=Once)
    parser.add_argument("--hidden", type=positive, default=7168, action=Once)
    parser.add_argument("--top-k", type=positive, default=8, action=Once)
    parser.add_argument("--experts", type=positive, default=256, action=Once)
    parser.add_argument("--seed", type=int, default=None, action=Once, help="default: a fresh one, printed")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    config = rocep.EpConfig()
    config.hidden, config.top_k, config.num_experts = args.hidden, args.top_k, args.experts
    config.max_tokens_per_rank = args.tokens
    try:
        config.validate(world)
    except rocep.ConfigError as error:
        if rank == 0:
            print(f"combine_accuracy.py: {error}", file=sys.stderr)
        sys.exit(1)
    fresh = int(np.random.SeedSequence().entropy % 2**31) if args.seed is None else args.seed
    seed = comm.bcast(fresh if rank == 0 else None)
    rng = np.random.default_rng(seed + rank)
    tokens = bf16.from_float(rng.standard_normal((args.tokens, args.hidden)))
    ids = np.argsort(rng.random((args.tokens, args.experts)), axis=1)[:, :args.top_k].astype(np.int32)
    weights = rng.random((args.tokens, args.top_k)).astype(np.float32)

    def expert_outputs(outliers: bool):
        """Row of (source, token, k) on this rank: a function of its origin, drawn once per call."""
        def outputs_of(src_info):
            values = np.stack([np.random.default_rng([seed, rank, int(s), int(t), int(k) + 1]).standard_normal(
                args.hidden) for s, t, k in src_info])
            if outliers:
                mask = np.random.default_rng(seed + 1).random(values.shape) < 1e-3
                values = np.where(mask, values * 100, values)
            return bf16.from_float(values)
        return outputs_of

    lines = []
    for layout, name in ((rocep.Layout.PER_TOKEN, "per-token"), (rocep.Layout.EXPANDED, "expanded, weighted")):
        for outliers in (False, True):
            outputs_of = expert_outputs(outliers)
            reference = combined(config, layout, tokens, ids, weights, outputs_of, rocep.CombineDtype.BF16)
            fp8 = combined(config, layout, tokens, ids, weights, outputs_of, rocep.CombineDtype.FP8_BLOCK128)
            diff = max(comm.allgather(calc_diff(fp8, reference)))
            lines.append(f"{name:<20} {'outliers (1e-3 of elements x100)' if outliers else 'normal':<34} {diff:.3e}")
    if rank == 0:
        print(f"fp8 block-128 combine against bf16, calc_diff (the worst rank), EP{world}, {args.tokens} tokens, "
              f"hidden {args.hidden}, top-{args.top_k}, {args.experts} experts, CPU reference, seed {seed}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
