#!/usr/bin/env bash
# The main job: builds rocep and runs the dispatch/combine benchmark with one MPI rank per GPU. Without a
# GPU it runs 2 ranks on the CPU reference backend; with one GPU, 1 rank (EP1: every expert local, nothing
# crosses a link), since 2 ranks sharing a GPU without MPS are time-sliced and their times mean nothing; it
# says so in both cases. With a GPU it then runs the fused SiLU benchmark (rocep_silu_bench) and the HBM
# floor of the dispatch and combine steps (rocep_memory_bench) on one GPU.
#   bench/run.sh [rocep_bench flags, e.g. --tokens=128,4096 --iterations=50]
#   ROCEP_BUILD_DIR, ROCEP_CMAKE_ARGS as for tests/run.sh; ROCEP_RANKS overrides the rank count.
# Every case runs at each SM budget of --sms (default: --sms=default,all, the library's default share of the
# multiprocessors and all of them; or a count, --sms=24). --cases=fused,split,concurrent picks the cases; the
# concurrent case (GPU) runs a prefill dispatch + combine (--concurrent_tokens=4096) while a compute-bound
# kernel holds the rest of the GPU on another stream, and reports each alone, both together, and their ratio.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/.ci/install-deps"
build=${ROCEP_BUILD_DIR:-$root/build/bench}
# shellcheck disable=SC2086 # ROCEP_CMAKE_ARGS holds several arguments
cmake -S "$root" -B "$build" -DROCEP_BUILD_TESTS=OFF ${ROCEP_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)" --target rocep_bench

gpus=$(bash "$root/.ci/count-gpus")
# A build without a GPU platform (ROCEP_GPU_PLATFORM=none, or no GPU compiler) runs the CPU reference.
gpu_build=0
[ -d "$build/bench/CMakeFiles/rocep_silu_bench.dir" ] && gpu_build=1
if [ "$gpu_build" -eq 0 ] && [ "$gpus" -gt 0 ]; then
  echo "bench/run.sh: $gpus GPU(s) found, but this build has no GPU platform (see its CMake output)"
  gpus=0
fi
ranks=${ROCEP_RANKS:-$((gpus >= 1 ? gpus : 2))}
if ! [[ "$ranks" =~ ^[1-9][0-9]*$ ]]; then
  echo "bench/run.sh: ROCEP_RANKS='$ranks' is invalid: a positive number of ranks" >&2
  exit 2
fi
if [ "$gpus" -eq 0 ]; then
  echo "bench/run.sh: no GPU to run on: running the CPU reference backend on $ranks ranks"
elif [ "$gpus" -eq 1 ] && [ "$ranks" -eq 1 ]; then
  echo "bench/run.sh: one GPU found: running 1 rank (EP1: every expert local, nothing crosses a link);" \
    "ROCEP_RANKS=2 runs 2 ranks sharing the GPU (at once under MPS, else time-sliced)"
elif [ "$gpus" -lt "$ranks" ]; then
  echo "bench/run.sh: $gpus GPU(s) for $ranks ranks: ranks share a GPU (at once under MPS, else time-sliced)," \
    "so the dispatch/combine times are not those of one GPU per rank"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
color=(--benchmark_color=false)  # plain rows in logs, unless the caller picks
for argument in "$@"; do
  if [ "$argument" = "--help" ] || [ "$argument" = "-h" ]; then
    "$build/bench/rocep_bench" --help
    exit 0
  fi
  case "$argument" in --benchmark_color=*) color=() ;; esac
done
mpirun --oversubscribe --bind-to none -np "$ranks" "$build/bench/rocep_bench" "${color[@]}" "$@"

# The fused SiLU kernels: one GPU, one process (flags: ROCEP_SILU_BENCH_ARGS, e.g. "--rows=32768 --n=2048").
if [ "$gpus" -gt 0 ]; then
  cmake --build "$build" -j "$(nproc)" --target rocep_silu_bench
  # shellcheck disable=SC2086 # ROCEP_SILU_BENCH_ARGS holds several arguments
  "$build/bench/rocep_silu_bench" ${ROCEP_SILU_BENCH_ARGS:-}
  # The HBM floor of the dispatch and combine steps (flags: ROCEP_MEMORY_BENCH_ARGS, e.g. "--tokens=4096").
  cmake --build "$build" -j "$(nproc)" --target rocep_memory_bench
  # shellcheck disable=SC2086 # ROCEP_MEMORY_BENCH_ARGS holds several arguments
  "$build/bench/rocep_memory_bench" ${ROCEP_MEMORY_BENCH_ARGS:-}
else
  echo "bench/run.sh: rocep_silu_bench and rocep_memory_bench skipped: they time the GPU only, and no GPU was found"
fi
