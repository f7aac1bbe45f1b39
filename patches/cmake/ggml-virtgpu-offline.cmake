# krun-gpu: CMAKE_PROJECT_INCLUDE for building llama.cpp's ggml-virtgpu backend without network.
#
# ggml/src/ggml-virtgpu/CMakeLists.txt declares ExternalProject_Add(venus_hw_header URL https://...)
# outside its `GGML_VIRTGPU_BACKEND STREQUAL "ONLY"` guard, and that target is part of ALL: a plain
# build tries to download venus_hw.h (retrying for about 85 s offline, then failing) even though in
# ONLY mode nothing includes the header. CMake runs this file after every project() call, before
# ggml's subdirectories are read.
#
# ExternalProject.cmake has include_guard(GLOBAL): once it is loaded here, the include() in ggml's
# CMakeLists.txt is a no-op and cannot put the original ExternalProject_Add back over ours.
include_guard(GLOBAL)
include(ExternalProject)

function(ExternalProject_Add target)
  if(target STREQUAL "venus_hw_header")
    # Keep the target name so add_dependencies(... venus_hw_header) elsewhere still resolves.
    add_custom_target(${target})
    # The guest frontend (virtgpu.h) includes venus_hw.h but uses none of its declarations,
    # so an empty header in the frontend's private include dir (its binary dir) is enough;
    # the source tree is left untouched.
    file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/venus_hw.h"
         "/* krun-gpu: venus_hw.h is not needed by ggml-virtgpu; empty on purpose (offline build). */\n")
    message(STATUS "krun-gpu: ${target} is an empty target (no download during the build)")
  else()
    # Any other external project that fetches something would reach the network at build time:
    # say so now. A local one (SOURCE_DIR only, e.g. ggml-vulkan's vulkan-shaders-gen, a host tool
    # built from the same tree) is built as declared.
    foreach(_krun_fetch_key URL GIT_REPOSITORY SVN_REPOSITORY HG_REPOSITORY CVS_REPOSITORY DOWNLOAD_COMMAND)
      list(FIND ARGN "${_krun_fetch_key}" _krun_fetch_index)
      if(NOT _krun_fetch_index EQUAL -1)
        message(FATAL_ERROR "krun-gpu: ExternalProject '${target}' would download during the build; "
                            "the build must be offline (see patches/cmake/ggml-virtgpu-offline.cmake)")
      endif()
    endforeach()
    _ExternalProject_Add(${target} ${ARGN})
  endif()
endfunction()
