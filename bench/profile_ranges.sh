#!/usr/bin/env bash
# Checks on an NVIDIA GPU machine, without nsys, that rocep's NVTX ranges reach a profiler: Nsight Compute,
# told to profile only the kernels launched inside the push/pop range rocep::dispatch ("rocep::dispatch/", of
# the default domain), runs rank 0 of a 2-rank rocep_bench (the per-token layout's fused dispatch of 128
# tokens at the default SM budget). Passes when it profiled dispatch()'s kernel and nothing else (no combine,
# no split send/receive); fails when it profiled none (ranges compiled out, or no NVTX seen). Builds
# nothing: give it an NVIDIA build folder (ROCEP_PROFILER_RANGES=ON, the default) with rocep_bench built.
#   bench/profile_ranges.sh build/bench
set -euo pipefail
usage="usage: bench/profile_ranges.sh BUILD_DIR (an NVIDIA build folder, ROCEP_PROFILER_RANGES=ON, with \
rocep_bench built; needs ncu, Nsight Compute, on PATH)"
if [ $# -eq 1 ] && { [ "$1" = "--help" ] || [ "$1" = "-h" ]; }; then
  echo "$usage"
  exit 0
fi
if [ $# -ne 1 ]; then
  echo "$usage" >&2
  exit 2
fi
build=$1
bench=$build/bench/rocep_bench
if ! command -v ncu >/dev/null; then
  echo "profile_ranges: ncu (Nsight Compute) is not on PATH" >&2
  exit 2
fi
if [ ! -x "$bench" ]; then
  echo "profile_ranges: $bench not found: build it (cmake --build $build --target rocep_bench)" >&2
  exit 2
fi
if ! grep -rqs --include=flags.make --include=build.ninja ROCEP_RANGES_NVTX "$build"; then
  echo "profile_ranges: $build compiles no NVTX ranges: not an NVIDIA build, ROCEP_PROFILER_RANGES=OFF, or" \
    "no NVTX3 headers found (see its CMake output)" >&2
  exit 2
fi
# The fused dispatch of the per-token layout, at the default SM budget.
args=(--tokens=128 --iterations=2 --layouts=per-token --cases=fused --sms=default --benchmark_color=false)
# Rank 1 runs without ncu: one profiler's lines to read (two ranks' interleave). One metric: one pass, no
# replay (a replayed kernel would wait for a peer that runs it once). The first 3 launches only (the
# warm-up's): the timed calls queue behind a host-side gate, which ncu, waiting for the GPU's earlier work
# before it profiles a launch, waits on forever (seen: without --launch-count the 4th launch hung).
ncu=(ncu --nvtx --nvtx-include "rocep::dispatch/" --metrics gpu__time_duration.sum --launch-count 3
  --clock-control none --print-summary per-kernel)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0
mpirun --oversubscribe --bind-to none -np 1 "${ncu[@]}" "$bench" "${args[@]}" : -np 1 "$bench" "${args[@]}" \
  2>&1 | tee "$log" || status=$?
if [ "$status" -ne 0 ]; then
  echo "profile_ranges: the profiled run failed (exit $status); its kernels so far:"
fi

profiled=$(grep -oE '==PROF== Profiling "[A-Za-z0-9_]+"' "$log" | cut -d'"' -f2 | sort | uniq -c || true)
echo "profile_ranges: kernels ncu profiled inside rocep::dispatch (launches, name):"
echo "${profiled:-  none}"
if [ -z "$profiled" ]; then
  echo "profile_ranges: FAIL: no kernel inside rocep::dispatch (ranges compiled out, or ncu saw no NVTX)"
  exit 1
fi
# dispatch()'s kernels: the fused dispatch of either layout and format, and the input scales' kernel after it.
if grep -qvE ' rocep_dispatch(_per_token(_scaled|_quantizing)?|_wide(_scaled)?|_scale_runs(_wide)?|_input_scales)?$' <<<"$profiled"; then
  echo "profile_ranges: FAIL: ncu profiled kernels that dispatch() does not launch"
  exit 1
fi
if [ "$status" -ne 0 ]; then
  echo "profile_ranges: FAIL: the profiled run failed"
  exit 1
fi
echo "profile_ranges: PASS"
