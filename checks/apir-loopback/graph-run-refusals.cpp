// krun-gpu: what the host library (libggml-virtgpu-backend, APIR 0.4) answers to GRAPH_RUN commands it must refuse,
// sent to its dispatcher directly, as virglrenderer would hand them over: a guest of an older series, and read
// records that are malformed or hostile. The loopback cannot play an older guest itself (it builds guest and host
// from one tree, so both carry the same protocol headers); here the bytes are written by hand, in the layout
// backend/shared/apir_backend.h gives.
//
//   graph-run-refusals BACKEND_LIB GGML_LIB REG_SYMBOL
//
// Prints one line per case, "CASE: return code N", then the host's log lines are on stderr.
// Exit status 0 once every case was sent (the test reads the codes); 2 when the library cannot start.

#include "backend/shared/api_remoting.h"
#include "backend/shared/apir_backend.h"
#include "backend/shared/apir_cs_rpc.h"

#include <dlfcn.h>

#ifndef APIR_GRAPH_RUN_READ_RECORD_SIZE  // a tree without APIR 0.4 (the bench's "before"): nothing to check
int main() {
    return 2;
}
#else

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

struct callbacks {
    const char * (*get_config)(uint32_t ctx_id, const char * key);
    void * (*get_shmem_ptr)(uint32_t ctx_id, uint32_t res_id);
};

const char * g_lib;
const char * g_reg;
alignas(64) unsigned char g_shmem[1 << 16];  // resource 1; every other id is unknown to "virgl"

const char * get_config(uint32_t, const char * key) {
    if (strcmp(key, "ggml.library.path") == 0) {
        return g_lib;
    }
    if (strcmp(key, "ggml.library.reg") == 0) {
        return g_reg;
    }
    return nullptr;
}

void * get_shmem_ptr(uint32_t, uint32_t res_id) {
    return res_id == 1 ? g_shmem : nullptr;
}

struct command {
    std::vector<char> bytes;
    template <typename T> void put(T v) { bytes.insert(bytes.end(), (const char *) &v, (const char *) &v + sizeof(v)); }
};

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BACKEND_LIB GGML_LIB REG_SYMBOL\n", argv[0]);
        return 2;
    }
    g_lib     = argv[2];
    g_reg     = argv[3];
    void * lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    auto init     = (uint32_t (*)(uint32_t, callbacks *)) dlsym(lib, "apir_backend_initialize");
    auto dispatch = (uint32_t (*)(uint32_t, callbacks *, uint32_t, char *, const char *, char *, const char *,
                                  char **)) dlsym(lib, "apir_backend_dispatcher");
    callbacks cbs = { get_config, get_shmem_ptr };
    if (!init || !dispatch || init(1, &cbs) != 6) {  // APIR_LOAD_LIBRARY_INIT_BASE_INDEX + success
        fprintf(stderr, "graph-run-refusals: the host library did not start\n");
        return 2;
    }
    auto send = [&](const char * name, command & c) {
        char   reply[256];
        char * after = reply;
        uint32_t rc  = dispatch(1, &cbs, APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN, c.bytes.data(), c.bytes.data() + c.bytes.size(), reply,
                                reply + sizeof(reply), &after);
        printf("%s: return code %u\n", name, rc);
        fflush(stdout);
    };

    // A 0.3 guest (patches 0006-0010): its GRAPH_RUN ends after graph_size, with no read fields.
    command old;
    old.put<uint32_t>(0);
    old.put<uint32_t>(3);
    old.put<uint32_t>(APIR_GRAPH_RUN_COMPUTES);
    old.put<uint32_t>(1);  // shmem res id
    old.put<uint64_t>(7);  // graph uid
    old.put<uint32_t>(0);  // n_writes
    old.put<uint64_t>(0);  // writes_size
    old.put<uint64_t>(0);  // graph_size
    send("0.3 guest", old);

    // The current layout from here on: the read fields follow graph_size; the records sit in resource 1.
    auto run = [&](uint32_t flags, uint32_t n_reads, uint64_t reads_size, uint32_t minor = APIR_PROTOCOL_MINOR,
                   uint64_t graph_size = 0) {
        command c;
        c.put<uint32_t>(APIR_PROTOCOL_MAJOR);
        c.put<uint32_t>(minor);
        c.put<uint32_t>(flags);
        c.put<uint32_t>(1);
        c.put<uint64_t>(0);  // no graph this host holds: once the reads pass, GRAPH_UNKNOWN
        c.put<uint32_t>(0);
        c.put<uint64_t>(0);
        c.put<uint64_t>(graph_size);
        c.put<uint32_t>(n_reads);
        c.put<uint64_t>(reads_size);
        return c;
    };
#if APIR_PROTOCOL_MINOR >= 5
    // A 0.4 guest (0011-0014): the same fields, but its graph bytes end without the use counts.
    command v4 = run(APIR_GRAPH_RUN_COMPUTES, 0, 0, 4);
    send("0.4 guest", v4);
    // A graph cut short of its use counts (0.5 layout otherwise): one node, no tensors, no counts.
    {
        uint32_t n_nodes = 1, n_tensors = 0;
        uint64_t node = 0;
        memset(g_shmem, 0, sizeof(g_shmem));
        memcpy(g_shmem, &n_nodes, 4);
        memcpy(g_shmem + 4, &node, 8);
        memcpy(g_shmem + 12, &n_tensors, 4);
        command g = run(APIR_GRAPH_RUN_COMPUTES | APIR_GRAPH_RUN_SENDS_GRAPH, 0, 0, APIR_PROTOCOL_MINOR, 16);
        send("graph short of its use counts", g);
    }
#endif
    const size_t    record = APIR_GRAPH_RUN_READ_RECORD_SIZE;
    apir_rpc_tensor rt;
    memset(&rt, 0, sizeof(rt));
    rt.buffer = 0x4141414141414141ull;  // a handle this host never gave out (forged, or freed)
    rt.type   = 0;
    rt.ne[0]  = 16;
    memset(g_shmem, 0, sizeof(g_shmem));
    memcpy(g_shmem, &rt, sizeof(rt));
    uint64_t size = 64;
    memcpy(g_shmem + sizeof(rt) + 8, &size, sizeof(size));
    uint32_t dst_res = 1;
    memcpy(g_shmem + sizeof(rt) + 16, &dst_res, sizeof(dst_res));
    command c = run(APIR_GRAPH_RUN_COMPUTES, 1, record);
    send("read of an unknown buffer", c);
    c = run(APIR_GRAPH_RUN_COMPUTES, 3, record);  // more records than bytes: reading past its own list
    send("reads_size short of n_reads", c);
    c = run(0, 1, record);  // a run that does not compute has nothing to read back
    send("reads without compute", c);
    c = run(APIR_GRAPH_RUN_COMPUTES, 0, 0);  // the control: well formed, only the graph is unknown
    send("no reads, unknown graph", c);
    return 0;
}
#endif
