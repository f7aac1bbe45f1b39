// krun-gpu: the ggml-virtgpu frontend's transport, through virglrenderer's public API.
//
// checks/apir-loopback/virtgpu-loopback.cpp joins the guest frontend to the host backend
// library directly, playing virglrenderer's part itself. This file replaces the same frontend
// file (virtgpu.cpp: the DRM ioctls) but leaves virglrenderer's part to virglrenderer: each
// shared-memory page is a blob of a real APIR context, each command goes through
// virgl_renderer_submit_cmd, and the host backend library is loaded by virglrenderer's APIR
// component (VIRGL_APIR_BACKEND_LIBRARY), in this process, as libkrun v1.19 drives it:
//
//   virgl_renderer_init(VENUS | NO_VIRGL, no render server)   rutabaga virgl_renderer.rs:330
//   context on the Venus capset, VIRGL_ROUTE_VENUS_TO_APIR=1   rutabaga virgl_renderer.rs:803
//   create_blob, then export_blob at once                      rutabaga virgl_renderer.rs:672, :679
//   the guest's view: get_map_ptr (macOS) or the fd mmapped     gpu virtio_gpu.rs:900-926, :771-800
//   submit_cmd in whole dwords                                 rutabaga virgl_renderer.rs:90-107
//   unref                                                      rutabaga virgl_renderer.rs:552
//
// The guest sends APIR commands offset past Venus's, as ggml-virtgpu does on the Venus capset.

#include "virtgpu.h"
#include "ggml-remoting.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

extern "C" {
#include "virglrenderer.h"
}

#ifndef VIRGL_RENDERER_BLOB_FD_TYPE_APPLE
#    define VIRGL_RENDERER_BLOB_FD_TYPE_APPLE 0x0004
#endif

namespace {

constexpr uint32_t CTX_ID = 1;

std::mutex            g_virgl;  // virglrenderer is one global state, not thread-safe
std::atomic<uint32_t> g_next_res_id{ 1 };
std::map<uint32_t, bool> g_fd_mapped;  // by resource: mapped here from its fd (else virglrenderer's pointer)

void cb_write_fence(void *, uint32_t) {}

void cb_write_context_fence(void *, uint32_t, uint32_t, uint64_t) {}

int cb_get_server_fd(void *, uint32_t) {
    return -1;  // libkrun has none to give (gpu virtio_gpu.rs:281)
}

virgl_renderer_callbacks g_callbacks = [] {
    virgl_renderer_callbacks cbs{};
    cbs.version             = 3;
    cbs.write_fence         = cb_write_fence;
    cbs.write_context_fence = cb_write_context_fence;
    cbs.get_server_fd       = cb_get_server_fd;
    return cbs;
}();

bool virgl_start() {
    static int cookie;
    if (!getenv("VIRGL_ROUTE_VENUS_TO_APIR")) {
        GGML_LOG_ERROR(GGML_VIRTGPU "virgl transport: set VIRGL_ROUTE_VENUS_TO_APIR=1 (libkrun knows no APIR capset)\n");
        return false;
    }
    int ret = virgl_renderer_init(&cookie, VIRGL_RENDERER_VENUS | VIRGL_RENDERER_NO_VIRGL, &g_callbacks);
    if (ret) {
        GGML_LOG_ERROR(GGML_VIRTGPU "virgl transport: virgl_renderer_init: %d\n", ret);
        return false;
    }
    const char name[] = "ggml-virtgpu";
    ret = virgl_renderer_context_create_with_flags(CTX_ID, VIRTGPU_DRM_CAPSET_VENUS, sizeof(name) - 1, name);
    if (ret) {
        GGML_LOG_ERROR(GGML_VIRTGPU "virgl transport: no context on the Venus capset: %d\n", ret);
        return false;
    }
    return true;
}

}  // namespace

int virtgpu_shmem_create(virtgpu * gpu, size_t size, virtgpu_shmem * shmem) {
    UNUSED(gpu);
    size        = align64(size, 16384);
    uint32_t id = g_next_res_id++;
    virgl_renderer_resource_create_blob_args args{};
    args.res_handle = id;
    args.ctx_id     = CTX_ID;
    args.blob_mem   = VIRGL_RENDERER_BLOB_MEM_HOST3D;
    args.blob_flags = VIRGL_RENDERER_BLOB_FLAG_USE_MAPPABLE;
    args.size       = size;

    std::lock_guard<std::mutex> hold(g_virgl);
    if (virgl_renderer_resource_create_blob(&args)) {
        return 1;
    }
    uint32_t fd_type = 0;
    int      fd      = -1;
    void *   ptr     = nullptr;
    if (virgl_renderer_resource_export_blob(id, &fd_type, &fd) == 0) {
        if (fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_APPLE) {
            uint64_t addr = 0;
            if (virgl_renderer_resource_get_map_ptr(id, &addr) == 0) {
                ptr = (void *) (uintptr_t) addr;
            }
        } else if (fd_type == VIRGL_RENDERER_BLOB_FD_TYPE_SHM) {
            void * m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            ptr      = m == MAP_FAILED ? nullptr : m;
        }
        close(fd);
    }
    if (!ptr) {
        GGML_LOG_ERROR(GGML_VIRTGPU "virgl transport: blob %u (type %u) cannot be mapped\n", id, fd_type);
        virgl_renderer_resource_unref(id);
        return 1;
    }
    g_fd_mapped[id] = fd_type != VIRGL_RENDERER_BLOB_FD_TYPE_APPLE;
    virgl_renderer_ctx_attach_resource(CTX_ID, (int) id);
    shmem->res_id     = id;
    shmem->mmap_size  = size;
    shmem->mmap_ptr   = ptr;
    shmem->gem_handle = id;
    return 0;
}

void virtgpu_shmem_destroy(virtgpu * gpu, virtgpu_shmem * shmem) {
    UNUSED(gpu);
    std::lock_guard<std::mutex> hold(g_virgl);
    // a pointer from get_map_ptr goes with the resource; an fd mapping is ours to drop
    if (g_fd_mapped[shmem->res_id]) {
        munmap(shmem->mmap_ptr, shmem->mmap_size);
    }
    g_fd_mapped.erase(shmem->res_id);
    virgl_renderer_ctx_detach_resource(CTX_ID, (int) shmem->res_id);
    virgl_renderer_resource_unref(shmem->res_id);
}

apir_encoder * remote_call_prepare(virtgpu * gpu, ApirCommandType apir_cmd_type, int32_t cmd_flags) {
    alignas(4) thread_local char buffer[4096];
    thread_local apir_encoder    enc;
    enc              = { buffer, buffer, buffer + sizeof(buffer), false };
    int32_t cmd_type = apir_cmd_type;
    if (!gpu->use_apir_capset) {
        cmd_type += VENUS_COMMAND_TYPE_LENGTH;
    }
    uint32_t reply_id = gpu->reply_shmem.res_id;
    apir_encode_int32_t(&enc, &cmd_type);
    apir_encode_int32_t(&enc, &cmd_flags);
    apir_encode_uint32_t(&enc, &reply_id);
    return &enc;
}

uint32_t remote_call(virtgpu * gpu, apir_encoder * enc, apir_decoder ** dec, float max_wait_ms,
                     long long * call_duration_ns) {
    UNUSED(max_wait_ms);
    auto * notif = (std::atomic_uint *) gpu->reply_shmem.mmap_ptr;
    notif->store(0);
    const size_t bytes = (size_t) (enc->cur - enc->start);
    if (bytes % 4) {
        // libkrun refuses such a command (rutabaga virgl_renderer.rs:94-96): say so, then send it whole
        fprintf(stderr, "virgl transport: a %zu-byte command is not whole dwords\n", bytes);
    }
    {
        std::lock_guard<std::mutex> hold(g_virgl);
        if (virgl_renderer_submit_cmd(const_cast<char *>(enc->start), (int) CTX_ID, (int) ((bytes + 3) / 4))) {
            GGML_ABORT(GGML_VIRTGPU "virgl transport: virgl_renderer_submit_cmd refused the command");
        }
    }
    // APIR answers inside submit_cmd: the notification is already there
    uint32_t value = notif->load(std::memory_order_acquire);
    if (value == 0) {
        GGML_ABORT(GGML_VIRTGPU "virgl transport: no reply after submit_cmd");
    }
    if (call_duration_ns) {
        *call_duration_ns = 0;
    }
    static thread_local apir_decoder reply;
    reply.cur   = (char *) gpu->reply_shmem.mmap_ptr + sizeof(uint32_t);
    reply.end   = (char *) gpu->reply_shmem.mmap_ptr + gpu->reply_shmem.mmap_size;
    reply.fatal = false;
    *dec        = &reply;
    return value - 1;
}

void remote_call_finish(virtgpu * gpu, apir_encoder * enc, apir_decoder * dec) {
    UNUSED(gpu);
    if (apir_encoder_get_fatal(enc)) {
        GGML_LOG_ERROR(GGML_VIRTGPU "%s: failed to encode the call\n", __func__);
    }
    if (apir_decoder_get_fatal(dec)) {
        GGML_LOG_ERROR(GGML_VIRTGPU "%s: failed to decode the reply\n", __func__);
    }
}

virtgpu * create_virtgpu() {
    if (!virgl_start()) {
        return nullptr;
    }
    virtgpu * gpu        = new virtgpu();
    gpu->use_apir_capset = false;  // the Venus capset, as on libkrun
    gpu->fd              = -1;
    util_sparse_array_init(&gpu->shmem_array, sizeof(virtgpu_shmem), 1024);
    if (mtx_init(&gpu->data_shmem_mutex, mtx_plain) != thrd_success ||
        virtgpu_shmem_create(gpu, SHMEM_REPLY_SIZE, &gpu->reply_shmem) ||
        virtgpu_shmem_create(gpu, SHMEM_DATA_SIZE, &gpu->data_shmem)) {
        GGML_ABORT(GGML_VIRTGPU "%s: virgl transport setup failed", __func__);
    }

    apir_encoder * enc         = remote_call_prepare(gpu, APIR_COMMAND_TYPE_HANDSHAKE, 0);
    uint32_t       guest_major = APIR_PROTOCOL_MAJOR, guest_minor = APIR_PROTOCOL_MINOR;
    apir_encode_uint32_t(enc, &guest_major);
    apir_encode_uint32_t(enc, &guest_minor);
    apir_decoder * dec = nullptr;
    if (remote_call(gpu, enc, &dec, 0, nullptr) != APIR_HANDSHAKE_MAGIC) {
        GGML_ABORT(GGML_VIRTGPU "%s: handshake through virglrenderer failed", __func__);
    }
    uint32_t host_major = 0, host_minor = 0;
    apir_decode_uint32_t(dec, &host_major);
    apir_decode_uint32_t(dec, &host_minor);
    GGML_LOG_INFO(GGML_VIRTGPU "virgl transport: guest %u.%u, host %u.%u\n", guest_major, guest_minor, host_major,
                  host_minor);

    enc          = remote_call_prepare(gpu, APIR_COMMAND_TYPE_LOADLIBRARY, 0);
    uint32_t ret = remote_call(gpu, enc, &dec, 0, nullptr);
    if (ret != APIR_LOAD_LIBRARY_SUCCESS) {
        GGML_LOG_ERROR(GGML_VIRTGPU "virgl transport: LoadLibrary failed (code %u)\n", ret);
        return nullptr;
    }
    return gpu;
}
