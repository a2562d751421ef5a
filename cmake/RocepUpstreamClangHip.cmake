# What an upstream clang (22) needs to compile HIP code against ROCm 5.2's headers and device libraries
# (the initial cache cmake/amd-upstream-clang.cmake turns it on). Included after find_package(hip); adds to
# rocep_gpu_runtime, so every target that includes hip/platform.hpp gets it:
#   - __AMDGCN_WAVEFRONT_SIZE=64: HIP 5.2's warpSize is defined from it, and clang 22 no longer defines it
#     (rocep's own code states its wave size in hip/portable.hpp);
#   - a device-library folder: ROCm 5.2's bitcode stops at oclc_isa_version_940.bc, so the ISA-version file
#     of every newer target (one constant each) is generated beside links to the installed bitcode;
#   - code object v5: clang 22 defaults to v6, for which ROCm 5.2 has no oclc_abi_version file;
#   - __atomic_work_item_fence, which __syncthreads / __threadfence* call and only ROCm 5.2's hip.bc defined;
#   - no warning for the device-only flags on plain C++ files.
# Out: ROCEP_UPSTREAM_CLANG_HIP_FLAGS, the flags above (the ISA contract test compiles with them too).

find_path(ROCEP_ROCM_DEVICE_LIBS ocml.bc
          PATHS ${ROCM_PATH}/amdgcn/bitcode /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/amdgcn/bitcode
                /usr/lib/x86_64-linux-gnu/amdgcn/bitcode
          NO_DEFAULT_PATH REQUIRED)
set(_rocep_device_libs ${PROJECT_BINARY_DIR}/rocm-device-libs)
file(MAKE_DIRECTORY ${_rocep_device_libs})
file(GLOB _rocep_bitcode ${ROCEP_ROCM_DEVICE_LIBS}/*.bc)
foreach(_rocep_file IN LISTS _rocep_bitcode)
  get_filename_component(_rocep_name ${_rocep_file} NAME)
  file(CREATE_LINK ${_rocep_file} ${_rocep_device_libs}/${_rocep_name} SYMBOLIC)
endforeach()

# oclc_isa_version_<n>.bc defines __oclc_ISA_version = major * 1000 + minor * 100 + stepping, the last two
# digits of gfx<major><minor><stepping> being hexadecimal (gfx942 -> 9402, gfx950 -> 9500).
foreach(_rocep_target IN LISTS GPU_TARGETS)
  if(NOT _rocep_target MATCHES "^gfx([0-9]+)([0-9a-f])([0-9a-f])$")
    message(FATAL_ERROR "GPU_TARGETS entry '${_rocep_target}' is not of the form gfx<major><minor><stepping>")
  endif()
  set(_rocep_id ${CMAKE_MATCH_1}${CMAKE_MATCH_2}${CMAKE_MATCH_3})
  set(_rocep_bc ${_rocep_device_libs}/oclc_isa_version_${_rocep_id}.bc)
  if(EXISTS ${_rocep_bc})
    continue()
  endif()
  math(EXPR _rocep_version "${CMAKE_MATCH_1} * 1000 + 0x${CMAKE_MATCH_2} * 100 + 0x${CMAKE_MATCH_3}"
       OUTPUT_FORMAT DECIMAL)
  file(WRITE ${_rocep_device_libs}/oclc_isa_version_${_rocep_id}.ll
       "target triple = \"amdgcn-amd-amdhsa\"\n"
       "@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 ${_rocep_version}\n")
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} --target=amdgcn-amd-amdhsa -nogpulib -c -emit-llvm
                          ${_rocep_device_libs}/oclc_isa_version_${_rocep_id}.ll -o ${_rocep_bc}
                  RESULT_VARIABLE _rocep_result ERROR_VARIABLE _rocep_error)
  if(NOT _rocep_result EQUAL 0)
    message(FATAL_ERROR "rocep: generating ${_rocep_bc} failed: ${_rocep_error}")
  endif()
  message(STATUS "rocep: generated oclc_isa_version_${_rocep_id}.bc (ISA version ${_rocep_version})")
endforeach()

set(ROCEP_UPSTREAM_CLANG_HIP_FLAGS
    -D__AMDGCN_WAVEFRONT_SIZE=64 --rocm-device-lib-path=${_rocep_device_libs} -mcode-object-version=5
    -include ${CMAKE_CURRENT_LIST_DIR}/hip52-upstream-clang/work_item_fence.h -Wno-unused-command-line-argument)
target_compile_options(rocep_gpu_runtime INTERFACE ${ROCEP_UPSTREAM_CLANG_HIP_FLAGS})
message(STATUS "rocep: upstream clang ${CMAKE_CXX_COMPILER_VERSION} over HIP ${ROCEP_HIP_VERSION} "
               "(device libraries ${_rocep_device_libs})")
