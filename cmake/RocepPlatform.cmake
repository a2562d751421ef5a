# Chooses the GPU platform before project(): the AMD build on a ROCm whose CMake HIP language is unusable
# (Debian's ROCm 5.2 installs hip-lang under lib/<multiarch>, where CMake does not look) compiles everything
# with hipcc as the C++ compiler, and that must be set before the first language is enabled.
#
# In:  ROCEP_GPU_PLATFORM (amd | nvidia | none | empty = detect), GPU_TARGETS (AMD architectures).
# Out: ROCEP_PLATFORM (resolved), ROCEP_HIP_VERSION, ROCEP_AMD_HIP_LANGUAGE (ON = CMake HIP language).

set(ROCEP_GPU_PLATFORM "" CACHE STRING "GPU platform: amd, nvidia or none (empty: detect)")
set_property(CACHE ROCEP_GPU_PLATFORM PROPERTY STRINGS "" amd nvidia none)

find_program(ROCEP_HIPCC hipcc PATHS /opt/rocm/bin ENV ROCM_PATH PATH_SUFFIXES bin)
find_program(ROCEP_NVCC nvcc PATHS /usr/local/cuda/bin ENV CUDA_PATH PATH_SUFFIXES bin)

set(ROCEP_HIP_VERSION "")
if(ROCEP_HIPCC)
  execute_process(COMMAND ${ROCEP_HIPCC} --version OUTPUT_VARIABLE _rocep_hipcc_version ERROR_QUIET
                  RESULT_VARIABLE _rocep_hipcc_result)
  if(_rocep_hipcc_result EQUAL 0 AND _rocep_hipcc_version MATCHES "HIP version: ([0-9]+\\.[0-9]+)")
    set(ROCEP_HIP_VERSION ${CMAKE_MATCH_1})
  endif()
endif()

if(ROCEP_GPU_PLATFORM STREQUAL "")
  if(ROCEP_HIP_VERSION)
    set(ROCEP_PLATFORM amd)
    set(_rocep_reason "ROCm hipcc ${ROCEP_HIP_VERSION} found at ${ROCEP_HIPCC}")
  elseif(ROCEP_NVCC)
    set(ROCEP_PLATFORM nvidia)
    set(_rocep_reason "nvcc found at ${ROCEP_NVCC}")
  else()
    set(ROCEP_PLATFORM none)
    set(_rocep_reason "neither ROCm hipcc nor nvcc found")
  endif()
else()
  set(ROCEP_PLATFORM ${ROCEP_GPU_PLATFORM})
  set(_rocep_reason "set by ROCEP_GPU_PLATFORM")
endif()
if(NOT ROCEP_PLATFORM MATCHES "^(amd|nvidia|none)$")
  message(FATAL_ERROR "ROCEP_GPU_PLATFORM='${ROCEP_GPU_PLATFORM}' is invalid: allowed values are amd, nvidia, none")
endif()
message(STATUS "rocep: GPU platform '${ROCEP_PLATFORM}' (${_rocep_reason})")

set(ROCEP_AMD_HIP_LANGUAGE OFF)
if(ROCEP_PLATFORM STREQUAL "amd")
  if(NOT ROCEP_HIP_VERSION)
    message(FATAL_ERROR "ROCEP_GPU_PLATFORM=amd needs ROCm's hipcc (set ROCM_PATH or put hipcc on PATH)")
  endif()
  if(ROCEP_HIP_VERSION VERSION_GREATER_EQUAL 6.0)
    set(_rocep_default_targets "gfx942;gfx950")
  else()
    set(_rocep_default_targets "gfx90a;gfx940")
  endif()
  set(GPU_TARGETS "${_rocep_default_targets}" CACHE STRING "AMD GPU architectures to build for")
  set(CMAKE_HIP_ARCHITECTURES "${GPU_TARGETS}" CACHE STRING "AMD GPU architectures (follows GPU_TARGETS)" FORCE)
  # The HIP language needs hip-lang-config.cmake under <ROCm root>/lib/cmake.
  get_filename_component(_rocep_hipcc_real ${ROCEP_HIPCC} REALPATH)
  get_filename_component(_rocep_rocm_root ${_rocep_hipcc_real} DIRECTORY)
  get_filename_component(_rocep_rocm_root ${_rocep_rocm_root} DIRECTORY)
  if(EXISTS "${_rocep_rocm_root}/lib/cmake/hip-lang/hip-lang-config.cmake")
    set(ROCEP_AMD_HIP_LANGUAGE ON)
  elseif(NOT CMAKE_CXX_COMPILER)
    set(CMAKE_CXX_COMPILER ${ROCEP_HIPCC})
  elseif(NOT CMAKE_CXX_COMPILER MATCHES "(hipcc|clang)[^/]*$")
    # A folder configured before for another platform keeps its C++ compiler, which cannot compile HIP.
    message(FATAL_ERROR "ROCEP_GPU_PLATFORM=amd compiles with hipcc (or a HIP clang) as the C++ compiler, but "
                        "this build folder's CMAKE_CXX_COMPILER is ${CMAKE_CXX_COMPILER}, kept from an earlier "
                        "configuration: configure a fresh build folder, or pass "
                        "-DCMAKE_CXX_COMPILER=${ROCEP_HIPCC}")
  endif()
  if(ROCEP_AMD_HIP_LANGUAGE)
    set(_rocep_how "CMake HIP language")
  else()
    set(_rocep_how "${CMAKE_CXX_COMPILER} as the C++ compiler")
  endif()
  if(NOT ROCEP_AMD_HIP_LANGUAGE AND CMAKE_CXX_COMPILER MATCHES "hipcc[^/]*$")
    # hipcc compiles every C++ file as HIP, and for one given no --offload-arch (the host files, CMake's own
    # checks, host-only links) asks rocm_agent_enumerator for the machine's GPUs, which prints a Python
    # traceback on a machine without one. Those get the first target instead (they hold no device code): at
    # configure time through the environment, at build time through the launchers.
    list(GET GPU_TARGETS 0 _rocep_host_target)
    set(ENV{HCC_AMDGPU_TARGET} ${_rocep_host_target})
    set(_rocep_target_env ${CMAKE_COMMAND} -E env HCC_AMDGPU_TARGET=${_rocep_host_target})
    set(CMAKE_CXX_COMPILER_LAUNCHER ${_rocep_target_env} ${CMAKE_CXX_COMPILER_LAUNCHER})
    set(CMAKE_CXX_LINKER_LAUNCHER ${_rocep_target_env} ${CMAKE_CXX_LINKER_LAUNCHER})
  endif()
  message(STATUS "rocep: AMD targets ${GPU_TARGETS} via ${_rocep_how}")
endif()
