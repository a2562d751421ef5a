#!/usr/bin/env bash
# Builds rocep for the GPU platform whose compiler is found on this machine (hipcc before nvcc; neither:
# the CPU reference only) and runs every test: CPU tests at 1-4 MPI ranks, GPU tests at 2 ranks (in a GPU
# build; they report SKIPPED without a GPU) and, with more GPUs, at one rank per GPU, then the Python
# package's tests (built into a venv of its own, on the CPU reference, pytest at 2 and 4 MPI ranks).
#   ROCEP_BUILD_DIR   build folder (default: build/tests)
#   ROCEP_CMAKE_ARGS  extra CMake arguments, e.g. -DROCEP_GPU_PLATFORM=none
#   ROCEP_REQUIRE_PYTHON_TESTS=1  fail, rather than skip, where the Python tests cannot run (CI sets it)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/.ci/install-deps"
build=${ROCEP_BUILD_DIR:-$root/build/tests}
# shellcheck disable=SC2086 # ROCEP_CMAKE_ARGS holds several arguments
cmake -S "$root" -B "$build" -DROCEP_BUILD_BENCH=OFF ${ROCEP_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure
# ctest runs the GPU tests at 2 ranks; a machine with more GPUs also runs them on all of them, one rank each.
gpus=$(bash "$root/.ci/count-gpus")
if [ "$gpus" -gt 2 ] && [ -x "$build/tests/rocep_gpu_tests" ]; then
  ROCEP_BUILD_DIR=$build ROCEP_RANKS=$gpus ROCEP_TEST_TIMEOUT=1200 bash "$root/tests/run_mps.sh"
fi

build=$(cd "$build" && pwd)  # absolute: the Python tests run from inside it
# The Python module, built by CMake into a folder of its own (no network needed where numpy, pytest, mpi4py
# and nanobind are installed: the venv sees the system's packages and those of the venv python3 runs in,
# if any, and installs only what is missing), on the CPU reference. `pip install .` builds the same
# module; CI checks that route separately.
# Where they cannot run (no python3 with venv and headers, or their packages missing on a machine that cannot
# install them, e.g. without network) the C++ results above stand and the Python tests are reported skipped.
skip_python_tests() {
  if [ "${ROCEP_REQUIRE_PYTHON_TESTS:-0}" = 1 ]; then
    echo "python tests cannot run (ROCEP_REQUIRE_PYTHON_TESTS=1): $1" >&2
    exit 1
  fi
  echo "python tests SKIPPED: $1"
  exit 0
}
if ! python3 -c "import ensurepip, os, sysconfig, venv
assert os.path.exists(sysconfig.get_paths()['include'] + '/Python.h')" >/dev/null 2>&1; then
  skip_python_tests "python3 with venv and its headers (python3-venv, python3-dev) is missing"
fi
venv=$build/python-venv
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
# A venv made from a venv's python3 sees the base interpreter's packages only: the outer venv's (where a
# user's numpy or torch lies) are added by a .pth file, so that they are found rather than installed again.
python3 -c "import sys, sysconfig
if sys.prefix != sys.base_prefix:
    print('\n'.join(dict.fromkeys(sysconfig.get_paths()[key] for key in ('purelib', 'platlib'))))" \
  >"$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/rocep-outer-venv.pth"
missing=$("$venv/bin/python" -c "import importlib.util as u
print(' '.join(m for m in ('numpy', 'pytest', 'mpi4py', 'nanobind') if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086 # one argument per package
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $missing ||
    skip_python_tests "$missing missing, and pip could not install them (no network?)"
fi
cmake -S "$root" -B "$build/python" -DROCEP_BUILD_PYTHON=ON -DROCEP_GPU_PLATFORM=none -DROCEP_BUILD_TESTS=OFF \
  -DROCEP_BUILD_BENCH=OFF -DPython_EXECUTABLE="$venv/bin/python" >/dev/null
cmake --build "$build/python" -j "$(nproc)"
cmake --install "$build/python" --prefix "$build/python-module" >/dev/null
cp "$root"/python/rocep/*.py "$build/python-module/rocep/"
for ranks in 2 4; do
  echo "python tests at $ranks ranks"
  (cd "$build" && PYTHONPATH="$build/python-module" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe -np "$ranks" -x PYTHONPATH "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$root/python/tests")
done
