# The SHMEM engine that reaches peers on other nodes (docs/scale-out.md): NVSHMEM on NVIDIA, rocSHMEM on AMD.
#
# In:  ROCEP_SHMEM (auto | nvshmem | rocshmem | off; off by default until the transport serves dispatch and
#      combine, docs/scale-out.md); hints NVSHMEM_HOME / ROCSHMEM_HOME (CMake or environment).
#      NVSHMEM is also looked for in the nvidia-nvshmem-cu13 Python package of the python3 on PATH.
# Out: ROCEP_SHMEM_ENGINE (nvshmem | rocshmem | none); when not none, the INTERFACE target rocep_shmem (the
#      engine's headers, its host library and ROCEP_SHMEM_NVSHMEM / ROCEP_SHMEM_ROCSHMEM), and
#      ROCEP_SHMEM_DEVICE_LIBRARY: NVSHMEM's device library, which targets whose kernels call the engine link
#      with separable compilation (rocep_add_shmem_device_code); ROCEP_SHMEM_LIBRARY_DIR, the folder of the
#      engine's host library, which the installed library finds it in (its INSTALL_RPATH).

set(ROCEP_SHMEM off CACHE STRING "SHMEM engine for peers on other nodes: auto, nvshmem, rocshmem or off")
set_property(CACHE ROCEP_SHMEM PROPERTY STRINGS auto nvshmem rocshmem off)
if(NOT ROCEP_SHMEM MATCHES "^(auto|nvshmem|rocshmem|off)$")
  message(FATAL_ERROR "ROCEP_SHMEM='${ROCEP_SHMEM}' is invalid: allowed values are auto, nvshmem, rocshmem, off")
endif()
if(ROCEP_SHMEM STREQUAL "nvshmem" AND NOT ROCEP_PLATFORM STREQUAL "nvidia")
  message(FATAL_ERROR "ROCEP_SHMEM=nvshmem needs ROCEP_GPU_PLATFORM=nvidia (this build: ${ROCEP_PLATFORM})")
endif()
if(ROCEP_SHMEM STREQUAL "rocshmem" AND NOT ROCEP_PLATFORM STREQUAL "amd")
  message(FATAL_ERROR "ROCEP_SHMEM=rocshmem needs ROCEP_GPU_PLATFORM=amd (this build: ${ROCEP_PLATFORM})")
endif()

set(ROCEP_SHMEM_ENGINE none)
set(_rocep_shmem_wanted ${ROCEP_SHMEM})
if(ROCEP_SHMEM STREQUAL "auto")
  set(_rocep_shmem_wanted none)
  if(ROCEP_PLATFORM STREQUAL "nvidia")
    set(_rocep_shmem_wanted nvshmem)
  elseif(ROCEP_PLATFORM STREQUAL "amd")
    set(_rocep_shmem_wanted rocshmem)
  endif()
endif()

if(_rocep_shmem_wanted STREQUAL "nvshmem")
  set(_rocep_nvshmem_hints ${NVSHMEM_HOME} $ENV{NVSHMEM_HOME})
  find_program(_rocep_python3 python3)
  if(_rocep_python3)
    execute_process(COMMAND ${_rocep_python3} -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])"
                    OUTPUT_VARIABLE _rocep_nvshmem_python OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    list(APPEND _rocep_nvshmem_hints ${_rocep_nvshmem_python})
  endif()
  find_path(ROCEP_NVSHMEM_INCLUDE_DIR nvshmem.h HINTS ${_rocep_nvshmem_hints} PATH_SUFFIXES include)
  find_library(ROCEP_NVSHMEM_HOST_LIBRARY NAMES nvshmem_host libnvshmem_host.so.3 HINTS ${_rocep_nvshmem_hints}
               PATH_SUFFIXES lib lib64)
  find_library(ROCEP_NVSHMEM_DEVICE_LIBRARY NAMES libnvshmem_device.a nvshmem_device
               HINTS ${_rocep_nvshmem_hints} PATH_SUFFIXES lib lib64)
  if(ROCEP_NVSHMEM_INCLUDE_DIR AND ROCEP_NVSHMEM_HOST_LIBRARY AND ROCEP_NVSHMEM_DEVICE_LIBRARY)
    set(ROCEP_SHMEM_ENGINE nvshmem)
    add_library(rocep_shmem INTERFACE)
    target_include_directories(rocep_shmem SYSTEM INTERFACE ${ROCEP_NVSHMEM_INCLUDE_DIR})
    target_link_libraries(rocep_shmem INTERFACE ${ROCEP_NVSHMEM_HOST_LIBRARY} CUDA::cuda_driver)
    target_compile_definitions(rocep_shmem INTERFACE ROCEP_SHMEM_NVSHMEM)
    set(ROCEP_SHMEM_DEVICE_LIBRARY ${ROCEP_NVSHMEM_DEVICE_LIBRARY})
    get_filename_component(ROCEP_SHMEM_LIBRARY_DIR ${ROCEP_NVSHMEM_HOST_LIBRARY} DIRECTORY)
    message(STATUS "rocep: SHMEM engine NVSHMEM (${ROCEP_NVSHMEM_HOST_LIBRARY})")
  elseif(ROCEP_SHMEM STREQUAL "nvshmem")
    message(FATAL_ERROR "ROCEP_SHMEM=nvshmem: NVSHMEM not found (looked for include/nvshmem.h, \
lib/libnvshmem_host.so.3 and lib/libnvshmem_device.a under NVSHMEM_HOME and the nvidia-nvshmem-cu13 Python \
package: '${_rocep_nvshmem_hints}'); pip install nvidia-nvshmem-cu13 or set NVSHMEM_HOME")
  endif()
elseif(_rocep_shmem_wanted STREQUAL "rocshmem")
  set(_rocep_rocshmem_hints ${ROCSHMEM_HOME} $ENV{ROCSHMEM_HOME} ${ROCM_PATH} $ENV{ROCM_PATH} /opt/rocm)
  find_path(ROCEP_ROCSHMEM_INCLUDE_DIR rocshmem/rocshmem.hpp HINTS ${_rocep_rocshmem_hints} PATH_SUFFIXES include)
  find_library(ROCEP_ROCSHMEM_LIBRARY rocshmem HINTS ${_rocep_rocshmem_hints} PATH_SUFFIXES lib lib64)
  if(ROCEP_ROCSHMEM_INCLUDE_DIR AND ROCEP_ROCSHMEM_LIBRARY)
    set(ROCEP_SHMEM_ENGINE rocshmem)
    add_library(rocep_shmem INTERFACE)
    target_include_directories(rocep_shmem SYSTEM INTERFACE ${ROCEP_ROCSHMEM_INCLUDE_DIR})
    target_link_libraries(rocep_shmem INTERFACE ${ROCEP_ROCSHMEM_LIBRARY})
    target_compile_definitions(rocep_shmem INTERFACE ROCEP_SHMEM_ROCSHMEM)
    set(ROCEP_SHMEM_DEVICE_LIBRARY "")
    get_filename_component(ROCEP_SHMEM_LIBRARY_DIR ${ROCEP_ROCSHMEM_LIBRARY} DIRECTORY)
    message(STATUS "rocep: SHMEM engine rocSHMEM (${ROCEP_ROCSHMEM_LIBRARY})")
  elseif(ROCEP_SHMEM STREQUAL "rocshmem")
    message(FATAL_ERROR "ROCEP_SHMEM=rocshmem: rocSHMEM not found (looked for include/rocshmem/rocshmem.hpp and \
librocshmem under ROCSHMEM_HOME, ROCM_PATH and /opt/rocm: '${_rocep_rocshmem_hints}')")
  endif()
endif()
if(ROCEP_SHMEM_ENGINE STREQUAL "none")
  message(STATUS "rocep: no SHMEM engine (ROCEP_SHMEM=${ROCEP_SHMEM}): groups stay within one node")
endif()

# rocep_add_shmem_device_code(target): the target's kernels call the engine: relocatable device code, linked
# with the engine's device library (rocSHMEM's is inside its one library, linked through rocep_shmem).
function(rocep_add_shmem_device_code target)
  target_link_libraries(${target} PRIVATE rocep_shmem)
  if(ROCEP_SHMEM_ENGINE STREQUAL "nvshmem")
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION ON CUDA_RESOLVE_DEVICE_SYMBOLS ON)
    target_link_libraries(${target} PRIVATE ${ROCEP_SHMEM_DEVICE_LIBRARY})
  elseif(ROCEP_SHMEM_ENGINE STREQUAL "rocshmem")
    target_compile_options(${target} PRIVATE -fgpu-rdc)
    target_link_options(${target} PRIVATE -fgpu-rdc)
  endif()
endfunction()
