#!/usr/bin/env bash
# Runs the GPU tests at ROCEP_RANKS ranks (default 4), the same number on each GPU. Where that is more than
# one, on NVIDIA they share each GPU under MPS: the script starts an MPS control daemon of its own (its pipe and
# log folders in a temporary folder), gives each rank 100 / (ranks per GPU) percent of the GPU's threads
# (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and stops the daemon however the run ends. On AMD the ranks share each
# GPU as they are. Arguments go to rocep_gpu_tests, e.g. --gtest_filter='GpuPerToken.*'.
#   ROCEP_BUILD_DIR      a GPU build holding tests/rocep_gpu_tests (default: build/tests, tests/run.sh's)
#   ROCEP_RANKS          ranks, a multiple of the GPU count (default 4: EP4 on two GPUs)
#   ROCEP_TEST_TIMEOUT   seconds before the run is stopped (default 3600)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ROCEP_BUILD_DIR:-$root/build/tests}
binary=$build/tests/rocep_gpu_tests
ranks=${ROCEP_RANKS:-4}
if [ ! -x "$binary" ]; then
  echo "run_mps: $binary not found: build the GPU tests first (bash tests/run.sh, or cmake --build" \
    "$build --target rocep_gpu_tests)" >&2
  exit 2
fi
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
  echo "run_mps: ROCEP_RANKS='$ranks': a positive whole number of ranks" >&2
  exit 2
fi
gpus=$(bash "$root/.ci/count-gpus")
if [ "$gpus" -eq 0 ]; then
  echo "run_mps: no GPU found (nvidia-smi, rocm-smi)" >&2
  exit 2
fi
if [ $((ranks % gpus)) -ne 0 ]; then
  echo "run_mps: ROCEP_RANKS=$ranks: a multiple of the $gpus GPUs, so that each GPU holds as many ranks" >&2
  exit 2
fi
per_gpu=$((ranks / gpus))

if [ "$per_gpu" -eq 1 ]; then
  echo "GPU tests at $ranks ranks, one per GPU"
elif command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  folder=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY=$folder/pipe CUDA_MPS_LOG_DIRECTORY=$folder/log
  export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / per_gpu))
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  trap 'echo quit | nvidia-cuda-mps-control; rm -rf "$folder"' EXIT
  echo "GPU tests at $ranks ranks on $gpus GPUs, $per_gpu per GPU under MPS with" \
    "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE% of its threads each"
else
  echo "GPU tests at $ranks ranks on $gpus GPUs, $per_gpu per GPU"
fi
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout "${ROCEP_TEST_TIMEOUT:-3600}" mpirun --oversubscribe --bind-to none -np "$ranks" "$binary" "$@"
