# Initial cache for AMD builds of MI300X (gfx942) and MI355X (gfx950) with an upstream clang over Debian 12's
# ROCm 5.2 HIP headers and device libraries, for machines without a ROCm >= 6 (CI compiles the headline
# targets this way):
#   cmake -S . -B build/amd-clang -C cmake/amd-upstream-clang.cmake
# Needs Debian's clang-22 lld-22 clang-tools-22 libclang-rt-22-dev (.ci/install-deps --amd-clang). What the
# ROCm 5.2 side lacks is supplied by cmake/RocepUpstreamClangHip.cmake. gfx90a / gfx940 stay on hipcc 5.2
# (clang 22 no longer knows gfx940). With a real ROCm 6 or 7, use its own compiler instead of this file.

set(ROCEP_UPSTREAM_CLANG_VERSION 22 CACHE STRING "Major version of the upstream clang that compiles HIP")
find_program(ROCEP_UPSTREAM_CLANGXX clang++-${ROCEP_UPSTREAM_CLANG_VERSION})
if(NOT ROCEP_UPSTREAM_CLANGXX)
  message(FATAL_ERROR "cmake/amd-upstream-clang.cmake: clang++-${ROCEP_UPSTREAM_CLANG_VERSION} not found "
                      "(bash .ci/install-deps --amd-clang installs it)")
endif()
set(CMAKE_CXX_COMPILER ${ROCEP_UPSTREAM_CLANGXX} CACHE FILEPATH "C++ compiler (upstream clang, compiles HIP)")
set(ROCEP_GPU_PLATFORM amd CACHE STRING "GPU platform: amd, nvidia or none (empty: detect)")
set(GPU_TARGETS "gfx942;gfx950" CACHE STRING "AMD GPU architectures to build for")
set(ROCEP_HIP52_UPSTREAM_CLANG ON CACHE BOOL "Compile HIP 5.2 headers with an upstream clang")
