# Loaded with -DCMAKE_PROJECT_INCLUDE=<this file> when building ggml-virtgpu.
#
# llama.cpp declares ExternalProject_Add(venus_hw_header ...) to download venus_hw.h at
# build time, even in GGML_VIRTGPU_BACKEND=ONLY mode, and its target is part of ALL.
# Offline it retries for ~85 s, fails the build and truncates any header placed there.
# Nothing from that header is used by the code we build, so the download target becomes
# an empty custom target and every other ExternalProject is passed through unchanged.
get_property(_krun_gpu_hooked GLOBAL PROPERTY KRUN_GPU_OFFLINE_VENUS_HW)
if(NOT _krun_gpu_hooked)
  set_property(GLOBAL PROPERTY KRUN_GPU_OFFLINE_VENUS_HW TRUE)
  include(ExternalProject)
  function(ExternalProject_Add target_name)
    if(target_name STREQUAL "venus_hw_header")
      message(STATUS "krun-gpu: venus_hw.h download disabled (offline build)")
      add_custom_target(venus_hw_header)
    else()
      _ExternalProject_Add(${ARGV})
    endif()
  endfunction()
endif()
