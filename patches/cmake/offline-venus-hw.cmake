# krun-gpu: build llama.cpp's ggml-virtgpu without network access.
#
# Used as -DCMAKE_PROJECT_INCLUDE=<this file>; CMake includes it after every project() call.
#
# ggml/src/ggml-virtgpu/CMakeLists.txt declares ExternalProject_Add(venus_hw_header URL
# <virglrenderer's src/venus_hw.h>) even with GGML_VIRTGPU_BACKEND=ONLY, and the target is part
# of ALL. Offline, its download step retries for about 85 s and then fails the build, and it
# truncates any venus_hw.h placed in the source tree. ggml-virtgpu includes the header but uses
# none of its definitions.
#
# Neutralization: ExternalProject_Add is wrapped; for the one project named venus_hw_header it
# defines an empty custom target of that name (so add_dependencies(ggml-virtgpu venus_hw_header)
# still resolves) and writes an empty venus_hw.h into that directory's binary dir, which the
# same CMakeLists already puts on ggml-virtgpu's include path. Every other ExternalProject_Add
# call goes through unchanged. The source tree is never written.

get_property(_krun_offline_venus_done GLOBAL PROPERTY KRUN_GPU_OFFLINE_VENUS_HW)
if(NOT _krun_offline_venus_done)
  set_property(GLOBAL PROPERTY KRUN_GPU_OFFLINE_VENUS_HW ON)
  include(ExternalProject)

  function(ExternalProject_Add name)
    if(name STREQUAL "venus_hw_header")
      message(STATUS "krun-gpu offline-venus-hw: venus_hw_header neutralized (no download; empty venus_hw.h stub)")
      file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/venus_hw.h"
        "/* krun-gpu offline stub: ggml-virtgpu includes venus_hw.h but uses none of it. */\n")
      add_custom_target(venus_hw_header)
    else()
      _ExternalProject_Add(${ARGV})
    endif()
  endfunction()
endif()
