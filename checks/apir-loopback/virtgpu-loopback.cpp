// krun-gpu: an in-process stand-in for the virtio-gpu transport of ggml-virtgpu.
//
// It replaces the frontend's virtgpu.cpp and virtgpu-shm.cpp (the DRM ioctls) and plays the
// part of virglrenderer's APIR component (MR 1590, src/apir/apir.c): HandShake answers as
// that host does (protocol 0.1), LoadLibrary dlopens VIRGL_APIR_BACKEND_LIBRARY and calls
// apir_backend_initialize, Forward calls apir_backend_dispatcher on the same bytes the guest
// would send. Shared-memory resources are plain anonymous mappings keyed by a resource id.
//
// So test-backend-ops sees "[virtgpu] <host device>" and every tensor, graph and op
// parameter crosses the real APIR encoders and decoders, with no VM and no virglrenderer:
// the host-side reproduction of a failure seen through QEMU. A host-side abort ends this
// process, where in a VM it would end the render worker.
//
// APIR_LOOPBACK_STATS=FILE: at exit, write a JSON count of the commands that crossed, by
// command, with where their time went: "encode_ns" (the frontend, from preparing the command
// to sending it: the graph serialization of GRAPH_COMPUTE is here), "host_ns" (the host's
// dispatcher: decode + the backend's work) and "reply_ns" (the frontend decoding the reply,
// until its next command or remote_call_finish). When the host library exports
// apir_backend_profile (patch 0008), host_ns is split further: "decode_ns" (decoding graphs),
// "compute_ns" (the backend's compute and synchronize) and "copy_ns" (tensor data in and out);
// the rest of host_ns is the dispatcher's own work. This is the profile bench/apir_remoting.py
// reads; through QEMU each command also pays a virtio kick, a host wake-up and a reply poll.
// "running" holds the same for the commands after the first that computed a graph: a run's commands
// without the model's load, whose many weight uploads (SET_TENSOR) vary from one process to the next.
// "host_graph" (patch 0017) is the last graph the host decoded, its nodes and use counts; "host_graphs_decoded"
// (patch 0021) how many graphs it decoded in all: a graph the guest runs again by its uid is not decoded.
// "writes_by_reference" (patch 0024) how many writes the host took from the guest's pages a GRAPH_RUN record
// named instead of carrying the bytes (APIR 0.6: a prompt's inputs computed into a host buffer).
//
// APIR_LOOPBACK_DEVICE_TYPE=gpu: report the host device as a GPU. With the CPU target the
// remote device is a CPU, which llama's tools hide; this lets llama-bench offload to it.
//
// APIR_LOOPBACK_NO_HOST_PTR=1: report that the host device cannot wrap host memory
// (caps.buffer_from_host_ptr false), as a GPU with its own memory (CUDA) does. The CPU target's
// buffers are then remote ones, whose tensor data crosses as commands (SET_TENSOR, GET_TENSOR,
// or with the graph), instead of shared pages the guest reads and writes directly.
//
// APIR_LOOPBACK_BLOB_MAX=BYTES: refuse a shared resource larger than BYTES, as a VM's blob window
// refuses one it has no room for (the frontend then aborts). The stats report the largest resource
// made after the command pages and the reply ("largest_blob"): a command too big for the pages
// asks for one of its own.
//
// APIR_LOOPBACK_ALLOC_PAD=BYTES: the host buffer type answers get_alloc_size of a quantized tensor
// BYTES more than it computes, as ggml-cuda's does for quantized rows that need padding (ggml
// accepts a larger size for quantized types without asking why). The CPU buffer type never pads,
// so without this the CPU target cannot tell whether the guest reserves what the host's buffer
// type asks for (patch 0010; checks/apir-loopback/alloc-size-check.cpp).

#include "virtgpu.h"
#include "ggml-remoting.h"
#include "backend/shared/apir_backend.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace {

// virglrenderer MR 1590 (c62e4b08) src/apir/apir-protocol.h answers the handshake with 0.1.
constexpr uint32_t HOST_PROTOCOL_MAJOR = 0;
constexpr uint32_t HOST_PROTOCOL_MINOR = 1;
constexpr uint32_t LOOPBACK_CTX_ID     = 1;

struct callbacks {
    const char * (*get_config)(uint32_t ctx_id, const char * key);
    void * (*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
};

using init_fn     = uint32_t (*)(uint32_t, callbacks *);
using dispatch_fn = uint32_t (*)(uint32_t, callbacks *, uint32_t, char *, const char *, char *, const char *, char **);
using profile_fn  = void (*)(uint64_t *, uint64_t *, uint64_t *);
using uses_fn     = void (*)(uint64_t *, uint64_t *);
using count_fn    = void (*)(uint64_t *);

std::mutex                  g_lock;
std::map<uint32_t, void *>  g_resources;
std::atomic<uint32_t>       g_next_res_id{ 1 };
dispatch_fn                 g_dispatch = nullptr;
// The host's lookups of a resource other than the command pages and the reply: where it writes a read
// straight into one of the guest's host buffers (patch 0014), never otherwise.
std::atomic<uint32_t>       g_data_res_id{ 0 };
std::atomic<uint32_t>       g_reply_res_id{ 0 };
std::atomic<uint64_t>       g_other_lookups{ 0 };
profile_fn                  g_profile  = nullptr;  // optional: hosts from patch 0008 on
uses_fn                     g_uses     = nullptr;  // optional: hosts from patch 0017 on
count_fn                    g_decoded  = nullptr;  // optional: hosts from patch 0021 on
count_fn                    g_by_ref   = nullptr;  // optional: hosts from patch 0024 on

// The profile: one slot per forwarded command, then HANDSHAKE and LOADLIBRARY.
constexpr int STAT_HANDSHAKE   = APIR_BACKEND_DISPATCH_TABLE_COUNT;
constexpr int STAT_LOADLIBRARY = APIR_BACKEND_DISPATCH_TABLE_COUNT + 1;
constexpr int STAT_SLOTS       = APIR_BACKEND_DISPATCH_TABLE_COUNT + 2;

struct command_stats {
    uint64_t n         = 0;
    uint64_t cmd_bytes = 0;
    uint64_t encode_ns = 0;
    uint64_t host_ns   = 0;
    uint64_t reply_ns  = 0;
    uint64_t decode_ns  = 0;
    uint64_t compute_ns = 0;
    uint64_t copy_ns    = 0;
};

std::mutex    g_stats_lock;
command_stats g_stats[STAT_SLOTS];
command_stats g_running[STAT_SLOTS];  // from the command after the first that computed
bool          g_computed = false;
const char *  g_stats_path = getenv("APIR_LOOPBACK_STATS");
const bool    g_device_is_gpu = [] {
    const char * v = getenv("APIR_LOOPBACK_DEVICE_TYPE");
    return v && strcmp(v, "gpu") == 0;
}();
const bool g_no_host_ptr = [] {
    const char * v = getenv("APIR_LOOPBACK_NO_HOST_PTR");
    return v && strcmp(v, "1") == 0;
}();
const size_t g_alloc_pad = [] {
    const char * v = getenv("APIR_LOOPBACK_ALLOC_PAD");
    return v ? (size_t) strtoull(v, nullptr, 10) : 0;
}();
const size_t g_blob_max = [] {
    const char * v = getenv("APIR_LOOPBACK_BLOB_MAX");
    return v ? (size_t) strtoull(v, nullptr, 10) : SIZE_MAX;
}();
std::atomic<uint64_t> g_largest_blob{ 0 };  // after the command pages and the reply

// Per thread: when the current command was prepared, and the command whose reply is being read.
thread_local uint64_t t_prepared_ns = 0;
thread_local uint64_t t_replied_ns  = 0;
thread_local int      t_reply_slot  = -1;
thread_local bool     t_reply_running = false;  // that command counts in g_running too

uint64_t now_ns() {
    return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The reply of the previous command ends when the frontend finishes it or prepares the next one.
void close_reply(uint64_t now) {
    if (t_reply_slot >= 0) {
        std::lock_guard<std::mutex> hold(g_stats_lock);
        g_stats[t_reply_slot].reply_ns += now - t_replied_ns;
        if (t_reply_running) {
            g_running[t_reply_slot].reply_ns += now - t_replied_ns;
        }
    }
    t_reply_slot = -1;
}

const char * stat_name(int slot) {
    if (slot == STAT_HANDSHAKE) {
        return "HANDSHAKE";
    }
    if (slot == STAT_LOADLIBRARY) {
        return "LOADLIBRARY";
    }
    const char * name   = apir_dispatch_command_name((ApirBackendCommandType) slot);
    const char * prefix = "backend_";
    return strncmp(name, prefix, strlen(prefix)) == 0 ? name + strlen(prefix) : name;
}

// One set of per-command stats as a JSON object (the commands that never crossed left out).
void write_command_stats(FILE * f, const command_stats * stats) {
    fprintf(f, "{");
    bool first = true;
    for (int i = 0; i < STAT_SLOTS; i++) {
        const command_stats & s = stats[i];
        if (s.n == 0) {
            continue;
        }
        fprintf(f,
                "%s\n  \"%s\": {\"n\": %llu, \"cmd_bytes\": %llu, \"encode_ns\": %llu, \"host_ns\": %llu, "
                "\"reply_ns\": %llu",
                first ? "" : ",", stat_name(i), (unsigned long long) s.n, (unsigned long long) s.cmd_bytes,
                (unsigned long long) s.encode_ns, (unsigned long long) s.host_ns, (unsigned long long) s.reply_ns);
        if (g_profile) {
            fprintf(f, ", \"decode_ns\": %llu, \"compute_ns\": %llu, \"copy_ns\": %llu",
                    (unsigned long long) s.decode_ns, (unsigned long long) s.compute_ns,
                    (unsigned long long) s.copy_ns);
        }
        fprintf(f, "}");
        first = false;
    }
    fprintf(f, "\n}");
}

void write_stats() {
    if (!g_stats_path) {
        return;
    }
    std::lock_guard<std::mutex> hold(g_stats_lock);
    FILE *                      f = fopen(g_stats_path, "w");
    if (!f) {
        fprintf(stderr, "apir-loopback: cannot write %s\n", g_stats_path);
        return;
    }
    fprintf(f, "{\"commands\": ");
    write_command_stats(f, g_stats);
    fprintf(f, ", \"running\": ");
    write_command_stats(f, g_running);
    fprintf(f, ", \"other_resource_lookups\": %llu, \"largest_blob\": %llu",
            (unsigned long long) g_other_lookups.load(), (unsigned long long) g_largest_blob.load());
    if (g_uses) {  // the last graph the host decoded: its nodes and the use counts it was given
        uint64_t nodes = 0, uses = 0;
        g_uses(&nodes, &uses);
        fprintf(f, ", \"host_graph\": {\"nodes\": %llu, \"uses\": %llu}", (unsigned long long) nodes,
                (unsigned long long) uses);
    }
    if (g_decoded) {  // how many graphs the host decoded (one sent by its uid again is run as held)
        uint64_t n = 0;
        g_decoded(&n);
        fprintf(f, ", \"host_graphs_decoded\": %llu", (unsigned long long) n);
    }
    if (g_by_ref) {  // how many writes the host took from the guest's pages by reference
        uint64_t n = 0;
        g_by_ref(&n);
        fprintf(f, ", \"writes_by_reference\": %llu", (unsigned long long) n);
    }
    fprintf(f, "}\n");
    fclose(f);
}

struct stats_at_exit {
    ~stats_at_exit() { write_stats(); }
} g_stats_at_exit;

// The hypervisor passes no configuration map on this route either: the backend library
// asks for these keys and the environment answers, as VIRGL_APIR's transition path does.
const char * loopback_get_config(uint32_t, const char * key) {
    if (strcmp(key, "ggml.library.path") == 0) {
        return getenv("APIR_LLAMA_CPP_GGML_LIBRARY_PATH");
    }
    if (strcmp(key, "ggml.library.reg") == 0) {
        return getenv("APIR_LLAMA_CPP_GGML_LIBRARY_REG");
    }
    return nullptr;
}

void * loopback_get_shmem_ptr(uint32_t, uint32_t res_id) {
    if (res_id != g_data_res_id && res_id != g_reply_res_id) {
        g_other_lookups++;
    }
    std::lock_guard<std::mutex> hold(g_lock);
    auto it = g_resources.find(res_id);
    return it == g_resources.end() ? nullptr : it->second;
}

callbacks g_callbacks = { loopback_get_config, loopback_get_shmem_ptr };

// A crash on either side ends this one process: say where, as a dead render worker's core would.
void on_fatal_signal(int sig) {
    void * frames[48];
    int    n = backtrace(frames, 48);
    dprintf(2, "apir-loopback: signal %d, backtrace:\n", sig);
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

struct install_handlers {
    install_handlers() {
        signal(SIGSEGV, on_fatal_signal);
        signal(SIGBUS, on_fatal_signal);
    }
} g_install_handlers;

uint32_t read_u32(const char *& cur, const char * end) {
    uint32_t v = 0;
    if (cur + sizeof(v) <= end) {
        memcpy(&v, cur, sizeof(v));
    }
    cur += sizeof(v);
    return v;
}

uint32_t host_load_library() {
    const char * path = getenv("VIRGL_APIR_BACKEND_LIBRARY");
    if (!path) {
        return APIR_LOAD_LIBRARY_ENV_VAR_MISSING;
    }
    void * handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        fprintf(stderr, "apir-loopback: dlopen %s: %s\n", path, dlerror());
        return APIR_LOAD_LIBRARY_CANNOT_OPEN;
    }
    auto init = (init_fn) dlsym(handle, "apir_backend_initialize");
    g_dispatch = (dispatch_fn) dlsym(handle, "apir_backend_dispatcher");
    g_profile  = (profile_fn) dlsym(handle, "apir_backend_profile");
    g_uses     = (uses_fn) dlsym(handle, "apir_backend_graph_uses");
    g_decoded  = (count_fn) dlsym(handle, "apir_backend_graphs_decoded");
    g_by_ref   = (count_fn) dlsym(handle, "apir_backend_writes_by_reference");
    if (!init || !g_dispatch) {
        return APIR_LOAD_LIBRARY_SYMBOL_MISSING;
    }
    uint32_t ret = init(LOOPBACK_CTX_ID, &g_callbacks);
    // 0 and INIT_BASE_INDEX + 0 both mean success to virglrenderer.
    if (ret == 0 || ret == APIR_LOAD_LIBRARY_INIT_BASE_INDEX) {
        return APIR_LOAD_LIBRARY_SUCCESS;
    }
    return ret < APIR_LOAD_LIBRARY_INIT_BASE_INDEX ? ret : APIR_LOAD_LIBRARY_INIT_BASE_INDEX + ret;
}

// Whether a forwarded command computes a graph: GRAPH_COMPUTE, or GRAPH_RUN (APIR 0.3 on) with its
// COMPUTES flag (a GRAPH_RUN that only carries pending writes does not). `args` follows the header.
bool computes_graph(uint32_t command, const char * args, const char * end) {
    if (command == APIR_COMMAND_TYPE_BACKEND_GRAPH_COMPUTE) {
        return true;
    }
#ifdef APIR_GRAPH_RUN_COMPUTES
    if (command == APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN && end - args >= 12) {
        uint32_t run_flags = 0;  // after the protocol's major and minor
        memcpy(&run_flags, args + 8, sizeof(run_flags));
        return run_flags & APIR_GRAPH_RUN_COMPUTES;
    }
#else
    (void) args;
    (void) end;
#endif
    return false;
}

// One command, as the host handles it: the reply goes into the reply resource after its
// 4-byte notification word, which carries the return value + 1.
// Returns the command's profile slot (-1: none); split: the host's decode, compute, copy ns;
// computes: whether it computed a graph.
int host_handle(const char * cmd, const char * cmd_end, uint64_t split[3], bool * computes) {
    const char * cur      = cmd;
    int32_t      cmd_type = (int32_t) read_u32(cur, cmd_end);
    uint32_t     flags    = read_u32(cur, cmd_end);
    uint32_t     reply_id = read_u32(cur, cmd_end);
    auto *       reply    = (char *) loopback_get_shmem_ptr(LOOPBACK_CTX_ID, reply_id);
    if (!reply) {
        GGML_ABORT("apir-loopback: no reply resource %u", reply_id);
    }
    auto *       notif   = (std::atomic_uint *) reply;
    char *       enc     = reply + sizeof(uint32_t);
    const char * enc_end = reply + SHMEM_REPLY_SIZE;
    uint32_t     ret     = 0;
    int          slot    = -1;

    switch (cmd_type) {
        case APIR_COMMAND_TYPE_HANDSHAKE:
            memcpy(enc, &HOST_PROTOCOL_MAJOR, sizeof(uint32_t));
            memcpy(enc + sizeof(uint32_t), &HOST_PROTOCOL_MINOR, sizeof(uint32_t));
            ret  = APIR_HANDSHAKE_MAGIC;
            slot = STAT_HANDSHAKE;
            break;
        case APIR_COMMAND_TYPE_LOADLIBRARY:
            ret  = g_dispatch ? (uint32_t) APIR_LOAD_LIBRARY_ALREADY_LOADED : host_load_library();
            slot = STAT_LOADLIBRARY;
            break;
        case APIR_COMMAND_TYPE_FORWARD:
            if (!g_dispatch) {
                ret = APIR_FORWARD_NO_DISPATCH_FCT;
            } else {
                char *   after = enc;
                uint64_t before[3] = { 0, 0, 0 };
                // GET_ALLOC_SIZE carries the buffer type's handle, then the tensor (its type first);
                // read before the dispatcher rewrites the tensor in place.
                bool pad_reply = false;
                if (flags == APIR_COMMAND_TYPE_BUFFER_TYPE_GET_ALLOC_SIZE && g_alloc_pad &&
                    cur + sizeof(apir_buffer_type_host_handle_t) + sizeof(ggml_tensor) <= cmd_end) {
                    ggml_type type;
                    memcpy(&type, cur + sizeof(apir_buffer_type_host_handle_t), sizeof(type));
                    pad_reply = ggml_is_quantized(type);
                }
                if (g_profile && g_stats_path) {
                    g_profile(&before[0], &before[1], &before[2]);
                }
                *computes = computes_graph(flags, cur, cmd_end);  // read before the dispatcher sees the bytes
                ret = APIR_FORWARD_BASE_INDEX +
                      g_dispatch(LOOPBACK_CTX_ID, &g_callbacks, flags, (char *) cur, cmd_end, enc, enc_end, &after);
                if (g_profile && g_stats_path) {
                    g_profile(&split[0], &split[1], &split[2]);
                    for (int k = 0; k < 3; k++) {
                        split[k] -= before[k];
                    }
                }
                if (flags == APIR_COMMAND_TYPE_DEVICE_GET_TYPE && g_device_is_gpu && after >= enc + sizeof(uint32_t)) {
                    uint32_t gpu_type = GGML_BACKEND_DEVICE_TYPE_GPU;
                    memcpy(enc, &gpu_type, sizeof(gpu_type));
                }
                // The reply is the size (a size_t) the host buffer type asks for.
                if (pad_reply && after >= enc + sizeof(size_t)) {
                    size_t size = 0;
                    memcpy(&size, enc, sizeof(size));
                    size += g_alloc_pad;
                    memcpy(enc, &size, sizeof(size));
                }
                // The reply is five bools of 4 bytes each: async, host_buffer, buffer_from_host_ptr, ...
                if (flags == APIR_COMMAND_TYPE_DEVICE_GET_PROPS && g_no_host_ptr && after >= enc + 12) {
                    memset(enc + 8, 0, 4);
                }
            }
            slot = flags < (uint32_t) APIR_BACKEND_DISPATCH_TABLE_COUNT ? (int) flags : -1;
            break;
        default:
            GGML_ABORT("apir-loopback: unknown command type %d", cmd_type);
    }
    notif->store(ret + 1, std::memory_order_release);
    return slot;
}

}  // namespace

int virtgpu_shmem_create(virtgpu * gpu, size_t size, virtgpu_shmem * shmem) {
    UNUSED(gpu);
    size = align64(size, 16384);
    if (size > g_blob_max) {
        fprintf(stderr, "apir-loopback: refused a shared resource of %zu bytes (APIR_LOOPBACK_BLOB_MAX %zu)\n", size,
                g_blob_max);
        return 1;
    }
    if (g_data_res_id.load() != 0) {
        uint64_t seen = g_largest_blob.load();
        while (size > seen && !g_largest_blob.compare_exchange_weak(seen, size)) {
        }
    }
    void * ptr = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) {
        return 1;
    }
    uint32_t id = g_next_res_id++;
    {
        std::lock_guard<std::mutex> hold(g_lock);
        g_resources[id] = ptr;
    }
    shmem->res_id     = id;
    shmem->mmap_size  = size;
    shmem->mmap_ptr   = ptr;
    shmem->gem_handle = id;
    return 0;
}

void virtgpu_shmem_destroy(virtgpu * gpu, virtgpu_shmem * shmem) {
    UNUSED(gpu);
    {
        std::lock_guard<std::mutex> hold(g_lock);
        g_resources.erase(shmem->res_id);
    }
    munmap(shmem->mmap_ptr, shmem->mmap_size);
}

apir_encoder * remote_call_prepare(virtgpu * gpu, ApirCommandType apir_cmd_type, int32_t cmd_flags) {
    thread_local char         buffer[4096];
    thread_local apir_encoder enc;
    if (g_stats_path) {
        t_prepared_ns = now_ns();
        close_reply(t_prepared_ns);
    }
    enc = { buffer, buffer, buffer + sizeof(buffer), false };
    int32_t  cmd_type = apir_cmd_type;
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
    uint64_t split[3] = { 0, 0, 0 };
    bool     computes = false;
    if (!g_stats_path) {
        host_handle(enc->start, enc->cur, split, &computes);
    } else {
        uint64_t sent = now_ns();
        int      slot = host_handle(enc->start, enc->cur, split, &computes);
        uint64_t done = now_ns();
        t_reply_running = false;
        if (slot >= 0) {
            std::lock_guard<std::mutex> hold(g_stats_lock);
            auto add = [&](command_stats & s) {
                s.n += 1;
                s.cmd_bytes += (uint64_t) (enc->cur - enc->start);
                s.encode_ns += sent - t_prepared_ns;
                s.host_ns += done - sent;
                s.decode_ns += split[0];
                s.compute_ns += split[1];
                s.copy_ns += split[2];
            };
            add(g_stats[slot]);
            if (g_computed) {
                add(g_running[slot]);
            }
            t_reply_running = g_computed;
            g_computed      = g_computed || computes;
        }
        t_reply_slot = slot;
        t_replied_ns = done;
    }
    uint32_t value = notif->load(std::memory_order_acquire);
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
    if (g_stats_path) {
        close_reply(now_ns());
    }
    if (apir_encoder_get_fatal(enc)) {
        GGML_LOG_ERROR(GGML_VIRTGPU "%s: failed to encode the call\n", __func__);
    }
    if (apir_decoder_get_fatal(dec)) {
        GGML_LOG_ERROR(GGML_VIRTGPU "%s: failed to decode the reply\n", __func__);
    }
}

virtgpu * create_virtgpu() {
    virtgpu * gpu        = new virtgpu();
    gpu->use_apir_capset = true;
    gpu->fd              = -1;
    util_sparse_array_init(&gpu->shmem_array, sizeof(virtgpu_shmem), 1024);
    if (mtx_init(&gpu->data_shmem_mutex, mtx_plain) != thrd_success ||
        virtgpu_shmem_create(gpu, SHMEM_REPLY_SIZE, &gpu->reply_shmem) ||
        virtgpu_shmem_create(gpu, SHMEM_DATA_SIZE, &gpu->data_shmem)) {
        GGML_ABORT(GGML_VIRTGPU "%s: loopback setup failed", __func__);
    }
    g_reply_res_id = gpu->reply_shmem.res_id;
    g_data_res_id  = gpu->data_shmem.res_id;

    apir_encoder * enc = remote_call_prepare(gpu, APIR_COMMAND_TYPE_HANDSHAKE, 0);
    uint32_t       guest_major = APIR_PROTOCOL_MAJOR, guest_minor = APIR_PROTOCOL_MINOR;
    apir_encode_uint32_t(enc, &guest_major);
    apir_encode_uint32_t(enc, &guest_minor);
    apir_decoder * dec = nullptr;
    if (remote_call(gpu, enc, &dec, 0, nullptr) != APIR_HANDSHAKE_MAGIC) {
        GGML_ABORT(GGML_VIRTGPU "%s: loopback handshake failed", __func__);
    }
    uint32_t host_major = 0, host_minor = 0;
    apir_decode_uint32_t(dec, &host_major);
    apir_decode_uint32_t(dec, &host_minor);
    GGML_LOG_INFO(GGML_VIRTGPU "loopback: guest %u.%u, host %u.%u\n", guest_major, guest_minor, host_major,
                  host_minor);

    enc          = remote_call_prepare(gpu, APIR_COMMAND_TYPE_LOADLIBRARY, 0);
    uint32_t ret = remote_call(gpu, enc, &dec, 0, nullptr);
    if (ret != APIR_LOAD_LIBRARY_SUCCESS) {
        GGML_LOG_ERROR(GGML_VIRTGPU "loopback: LoadLibrary failed (code %u)\n", ret);
        return nullptr;
    }
    return gpu;
}
