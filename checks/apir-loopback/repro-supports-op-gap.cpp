// Minimal reproduction (host side only) of the ggml-virtgpu supports_op decoding defect.
//
// The guest frontend (apir_encode_ggml_tensor_inline) sends an op as a raw ggml_tensor
// followed by raw copies of op->src[0], op->src[1], ... up to the first NULL source. The
// host (apir_decode_ggml_tensor_inplace) rewrites op->src[i] to point at those copies, also
// only up to the first NULL. SOFT_MAX with sinks but no mask has src[1] == NULL and
// src[2] == sinks: src[2] reaches the host backend as a guest address, and the backend's
// supports_op reads it (ggml-vulkan: ggml_nbytes() over every src; ggml-cpu: src->buffer).
//
// Here the "guest" tensors live in their own mapping, which is unmapped after encoding, as
// the guest's memory is not mapped in the host's render worker. Then the host library gets
// the bytes through apir_backend_dispatcher(DEVICE_SUPPORTS_OP) and crashes (SIGSEGV).
//
//   repro-supports-op-gap BACKEND_LIB GGML_LIB REG_SYMBOL [gap|nogap]
//
// "nogap" sends the same op with a mask (no NULL before a set source): it answers normally.
// Exit status: 0 and "supports_op=<0|1>" when the host answered.

#include "ggml.h"

#include <dlfcn.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct callbacks {
    const char * (*get_config)(uint32_t ctx_id, const char * key);
    void * (*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
};

static const char * g_lib;
static const char * g_reg;

static const char * get_config(uint32_t, const char * key) {
    if (strcmp(key, "ggml.library.path") == 0) {
        return g_lib;
    }
    if (strcmp(key, "ggml.library.reg") == 0) {
        return g_reg;
    }
    return nullptr;
}

static void * get_shmem_ptr(uint32_t, uint32_t) {
    return nullptr;
}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s BACKEND_LIB GGML_LIB REG_SYMBOL [gap|nogap]\n", argv[0]);
        return 2;
    }
    g_lib          = argv[2];
    g_reg          = argv[3];
    const bool gap = argc < 5 || strcmp(argv[4], "nogap") != 0;

    void * lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    auto init = (uint32_t (*)(uint32_t, callbacks *)) dlsym(lib, "apir_backend_initialize");
    auto dispatch = (uint32_t (*)(uint32_t, callbacks *, uint32_t, char *, const char *, char *, const char *,
                                  char **)) dlsym(lib, "apir_backend_dispatcher");
    callbacks cbs = { get_config, get_shmem_ptr };
    uint32_t  rc  = init(1, &cbs);
    if (rc != 6) {  // APIR_LOAD_LIBRARY_INIT_BASE_INDEX + APIR_BACKEND_INITIALIZE_SUCCESS
        fprintf(stderr, "apir_backend_initialize: %u\n", rc);
        return 2;
    }

    // The guest's tensors, in memory the host will not see.
    const size_t guest_size = 1 << 20;
    void *       guest_mem  = mmap(nullptr, guest_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ggml_init_params params = { guest_size, guest_mem, true };
    ggml_context *   ctx    = ggml_init(params);
    ggml_tensor *    a      = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
    ggml_tensor *    mask   = gap ? nullptr : ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 32, 4);
    ggml_tensor *    sinks  = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
    ggml_tensor *    op     = ggml_soft_max_ext(ctx, a, mask, 1.0f, 0.0f);
    ggml_soft_max_add_sinks(op, sinks);

    // What apir_encode_ggml_tensor_inline writes (no buffer: the op is not allocated yet).
    std::vector<char> cmd;
    auto              put = [&](const ggml_tensor * t) {
        cmd.insert(cmd.end(), (const char *) t, (const char *) t + sizeof(ggml_tensor));
    };
    put(op);
    for (int i = 0; i < GGML_MAX_SRC && op->src[i]; i++) {
        put(op->src[i]);
    }
    munmap(guest_mem, guest_size);

    char   reply[4096];
    char * after = reply;
    fprintf(stderr, "sending SOFT_MAX(src[1]=%s, src[2]=sinks) to DEVICE_SUPPORTS_OP\n", gap ? "NULL" : "mask");
    rc = dispatch(1, &cbs, 6 /* APIR_COMMAND_TYPE_DEVICE_SUPPORTS_OP */, cmd.data(), cmd.data() + cmd.size(), reply,
                  reply + sizeof(reply), &after);
    printf("dispatch=%u supports_op=%d\n", rc, (int) reply[0]);
    return 0;
}
