#!/usr/bin/env bash
# Builds rocep for the GPU platform found on this machine (or the CPU reference only) and runs every test:
# CPU tests at 1-4 MPI ranks, GPU tests at 2 ranks (they report SKIPPED without a GPU).
#   ROCEP_BUILD_DIR   build folder (default: build/tests)
#   ROCEP_CMAKE_ARGS  extra CMake arguments, e.g. -DROCEP_GPU_PLATFORM=none
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/.ci/install-deps"
build=${ROCEP_BUILD_DIR:-$root/build/tests}
# shellcheck disable=SC2086 # ROCEP_CMAKE_ARGS holds several arguments
cmake -S "$root" -B "$build" -DROCEP_BUILD_BENCH=OFF ${ROCEP_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure
