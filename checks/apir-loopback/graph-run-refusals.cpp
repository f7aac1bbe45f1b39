// krun-gpu: what the host library (libggml-virtgpu-backend, APIR 0.6) answers to commands it must refuse, sent
// to its dispatcher directly, as virglrenderer would hand them over: a guest of an older series, read records
// that are malformed or hostile, and (0018) hostile tensors, graphs and handles, each of which upstream's host
// trusted: it called through a made-up buffer type, wrote past a tensor, threw on an unknown source, recursed
// down a chain of sources until its stack ran out; (0024) by-reference write records naming no resource, setting
// the reserved word, holding more bytes than the tensor's buffer or ending past the address space, and one well
// formed, whose bytes must arrive. The loopback cannot play an older guest itself (it builds guest and host from
// one tree, so both carry the same protocol headers); here the bytes are written by hand, in the layout
// backend/shared/apir_backend.h gives.
//
//   graph-run-refusals BACKEND_LIB GGML_LIB REG_SYMBOL
//
// Prints one line per case, "CASE: return code N", then the host's log lines are on stderr; last, how much the
// host's heap grew over 150,003 well-formed tensor commands (0019), and what several virgl contexts in this
// one process get (0020).
// Exit status 0 once every case was sent (the test reads the codes); 2 when the library cannot start.

#include "backend/shared/api_remoting.h"
#include "backend/shared/apir_backend.h"
#include "backend/shared/apir_cs_rpc.h"

#include <dlfcn.h>
#include <malloc.h>

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
alignas(64) unsigned char g_shmem[1 << 16];  // resource 1; every other id but 2 is unknown to "virgl"
std::vector<uint64_t>     g_big;               // resource 2: a graph too large for resource 1

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
    return res_id == 1 ? (void *) g_shmem : res_id == 2 && !g_big.empty() ? (void *) g_big.data() : nullptr;
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
    char reply[256];
    auto call = [&](uint32_t type, command & c, uint32_t ctx_id = 1) {  // the virgl context the command came from
        char * after = reply;
        return dispatch(ctx_id, &cbs, type, c.bytes.data(), c.bytes.data() + c.bytes.size(), reply,
                        reply + sizeof(reply), &after);
    };
    auto send_as = [&](const char * name, uint32_t type, command & c, uint32_t ctx_id = 1) {
        uint32_t rc = call(type, c, ctx_id);
        printf("%s: return code %u\n", name, rc);
        fflush(stdout);
    };
    auto send = [&](const char * name, command & c) { send_as(name, APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN, c); };

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
                   uint64_t graph_size = 0, uint32_t res_id = 1, uint64_t uid = 0, uint32_t n_writes = 0,
                   uint64_t writes_size = 0) {
        command c;
        c.put<uint32_t>(APIR_PROTOCOL_MAJOR);
        c.put<uint32_t>(minor);
        c.put<uint32_t>(flags);
        c.put<uint32_t>(res_id);
        c.put<uint64_t>(uid);  // 0: no graph this host holds; once the reads pass, GRAPH_UNKNOWN
        c.put<uint32_t>(n_writes);
        c.put<uint64_t>(writes_size);
        c.put<uint64_t>(graph_size);
        c.put<uint32_t>(n_reads);
        c.put<uint64_t>(reads_size);
        return c;
    };
#if APIR_PROTOCOL_MINOR >= 5
    // A 0.4 guest (0011-0014): the same fields, but its graph bytes end without the use counts.
    command v4 = run(APIR_GRAPH_RUN_COMPUTES, 0, 0, 4);
    send("0.4 guest", v4);
#endif
#if APIR_PROTOCOL_MINOR >= 6
    // A 0.5 guest (0015-0016): the same layout, but it sends every write's bytes (no by-reference records).
    command v5 = run(APIR_GRAPH_RUN_COMPUTES, 0, 0, 5);
    send("0.5 guest", v5);
#endif
#if APIR_PROTOCOL_MINOR >= 5
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

    // 0018. A buffer type handle the host never gave out: upstream called alloc_buffer through it.
    command forged;
    forged.put<uint64_t>(0x4141414141414141ull);
    forged.put<uint64_t>(4096);
    send_as("buffer type never given out", APIR_COMMAND_TYPE_BUFFER_TYPE_ALLOC_BUFFER, forged);
    // A buffer of 4096 bytes of the device's buffer type, made for ctx_id as a guest gets one; 0 when refused.
    auto alloc_for = [&](uint32_t ctx_id) -> uint64_t {
        command none_c, alloc_c;
        if (call(APIR_COMMAND_TYPE_DEVICE_GET_BUFFER_TYPE, none_c, ctx_id) != 0) {
            return 0;
        }
        uint64_t buft_c = 0, made = 0;
        memcpy(&buft_c, reply, 8);
        alloc_c.put<uint64_t>(buft_c);
        alloc_c.put<uint64_t>(4096);
        if (call(APIR_COMMAND_TYPE_BUFFER_TYPE_ALLOC_BUFFER, alloc_c, ctx_id) != 0) {
            return 0;
        }
        memcpy(&made, reply, 8);
        return made;
    };
    uint64_t buffer = alloc_for(1);  // context 1's, for the tensors below
    if (buffer == 0) {
        fprintf(stderr, "graph-run-refusals: no buffer\n");
        return 2;
    }
    auto f32 = [&](uint64_t id, uint64_t data, uint32_t ne0) {  // ne0 floats at data in that buffer, op NONE
        apir_rpc_tensor t;
        memset(&t, 0, sizeof(t));
        t.id     = id;
        t.type   = 0;  // GGML_TYPE_F32
        t.buffer = buffer;
        t.ne[0]  = ne0;
        t.ne[1] = t.ne[2] = t.ne[3] = 1;
        t.nb[0]  = 4;
        t.nb[1] = t.nb[2] = t.nb[3] = 4 * ne0;
        t.data   = data;
        return t;
    };
    // A graph of one node (id 1) and its tensors, in resource 2, sent and computed.
    auto graph = [&](const char * name, const std::vector<apir_rpc_tensor> & tensors, uint64_t uid = 0,
                     uint32_t ctx_id = 1) {
        std::vector<char> g;
        auto              put = [&](const void * p, size_t n) { g.insert(g.end(), (const char *) p, (const char *) p + n); };
        uint32_t          n_nodes = 1, n_tensors = (uint32_t) tensors.size(), uses = 0;
        uint64_t          node = 1;
        put(&n_nodes, 4);
        put(&node, 8);
        put(&n_tensors, 4);
        put(tensors.data(), tensors.size() * sizeof(apir_rpc_tensor));
        put(&uses, 4);
        g_big.assign(g.size() / 8 + 1, 0);
        memcpy(g_big.data(), g.data(), g.size());
        command c = run(APIR_GRAPH_RUN_COMPUTES | APIR_GRAPH_RUN_SENDS_GRAPH, 0, 0, APIR_PROTOCOL_MINOR, g.size(), 2,
                        uid);
        send_as(name, APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN, c, ctx_id);
    };
    std::vector<apir_rpc_tensor> ts = { f32(1, 0, 16) };
    ts[0].src[0] = 99;  // no tensor 99 in the graph: upstream's tensor_ptrs.at threw
    graph("graph source unknown", ts);
    graph("graph tensor past its buffer", { f32(1, 4096 - 8, 16) });  // upstream: GGML_ASSERT, the host aborted
    ts = { f32(1, 0, 16) };
    ts[0].buffer = 0;  // upstream kept it, with the guest's number as its address
    ts[0].data   = 0x1000;
    graph("graph tensor of no buffer", ts);
    ts = { f32(1, 0, 1) };  // strides 0, so its bytes fit: upstream's ggml_new_tensor_4d asserted on the count
    ts[0].ne[1] = ts[0].ne[2] = 0xffffffffu;
    ts[0].nb[1] = ts[0].nb[2] = ts[0].nb[3] = ts[0].nb[0] = 0;
    graph("graph tensor of more elements than an int64_t counts", ts);
    ts = { f32(1, 0, 16), f32(2, 0, 16) };  // a view whose offset points far past its source
    ts[0].view_src  = 2;
    ts[0].view_offs = 1ull << 40;
    graph("graph view past its source", ts);
    // A chain of sources far deeper than upstream's recursion had stack for: refused by nothing, built
    // without recursion, and run (one node whose op is NONE).
    ts.clear();
    for (uint64_t id = 1; id <= 300000; id++) {
        ts.push_back(f32(id, 0, 1));
        ts.back().src[0] = id < 300000 ? id + 1 : 0;
    }
    graph("graph of a 300000-long chain of sources", ts);
    // The graph the host holds, sent by virgl context 1 with uid 7, then named by its uid: by context 1 it
    // runs; by context 2 (another guest process: uids are counted per process) it is GRAPH_UNKNOWN (3), so
    // that context sends its own graph, where upstream's host, serving every context in one process as krunkit
    // does, would have run context 1's.
    graph("a graph held for context 1", { f32(1, 0, 16) }, 7);
    command by_uid = run(APIR_GRAPH_RUN_COMPUTES, 0, 0, APIR_PROTOCOL_MINOR, 0, 1, 7);
    send_as("its uid from context 1", APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN, by_uid, 1);
    init(2, &cbs);  // a second guest process, initialized as virglrenderer does it (0020: shared; before, 13)
    send_as("its uid from context 2", APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN, by_uid, 2);
    g_big.clear();
    ts.clear();
    // SET_TENSOR or GET_TENSOR of `size` bytes between tensor t of buffer buf and resource 1's start
    auto tensor_io = [](uint64_t buf, const apir_rpc_tensor & t, uint64_t size) {
        command c;
        c.put<uint64_t>(buf);
        c.put(t);
        c.put<uint32_t>(1);
        c.put<uint64_t>(0);
        c.put<uint64_t>(size);
        return c;
    };
    // SET_TENSOR of 8192 bytes into a tensor of 64 (in a buffer of 4096): upstream copied them all.
    apir_rpc_tensor small = f32(1, 0, 16), half = f32(2, 1024, 8);
    command set = tensor_io(buffer, small, 8192);
    send_as("set_tensor past its tensor", APIR_COMMAND_TYPE_BUFFER_SET_TENSOR, set);
    // CPY_TENSOR from 16 floats into 8: upstream's CPU buffer copied ggml_nbytes(src).
    command cpy;
    cpy.put<uint64_t>(buffer);
    cpy.put(small);
    cpy.put(half);
    send_as("copy into a smaller tensor", APIR_COMMAND_TYPE_BUFFER_CPY_TENSOR, cpy);

#ifdef APIR_GRAPH_RUN_WRITE_BY_REF
    // APIR 0.6: a GRAPH_RUN (no compute) whose one write record names where its bytes lie (resource, offset)
    // instead of carrying them; the record sits at resource 1's start, the bytes 4096 further.
    auto by_ref = [&](const char * name, const apir_rpc_tensor & t, uint64_t len, uint32_t src_res, uint32_t reserved,
                      uint64_t src_offset = 4096) {
        memset(g_shmem, 0, 4096);
        const uint64_t offset = 0, sized = len | APIR_GRAPH_RUN_WRITE_BY_REF;
        unsigned char * p = g_shmem;
        memcpy(p, &t, sizeof(t));
        memcpy(p + sizeof(t), &offset, 8);
        memcpy(p + sizeof(t) + 8, &sized, 8);
        memcpy(p + sizeof(t) + 16, &src_res, 4);
        memcpy(p + sizeof(t) + 20, &reserved, 4);
        memcpy(p + sizeof(t) + 24, &src_offset, 8);
        command w = run(0, 0, 0, APIR_PROTOCOL_MINOR, 0, 1, 0, 1, sizeof(t) + 32);
        send(name, w);
    };
    for (int i = 0; i < 16; i++) {
        const float v = 0.25f * (float) (i + 1);
        memcpy(g_shmem + 4096 + 4 * i, &v, 4);
    }
    by_ref("write by reference from an unknown resource", small, 64, 9, 0);
    by_ref("write by reference with its reserved word set", small, 64, 1, 1);
    by_ref("write by reference past its tensor's buffer", small, 8192, 1, 0);
    by_ref("write by reference whose end wraps around", small, 64, 1, 0, UINT64_MAX - 16);
    by_ref("write by reference", small, 64, 1, 0);
    {  // what the tensor holds now, read back into resource 1's start
        command get = tensor_io(buffer, small, 64);
        const bool same = call(APIR_COMMAND_TYPE_BUFFER_GET_TENSOR, get) == 0 && memcmp(g_shmem, g_shmem + 4096, 64) == 0;
        printf("write by reference: the tensor holds the resource's bytes: %s\n", same ? "yes" : "no");
        fflush(stdout);
    }
#endif

    // 0019. Well-formed tensor commands, many of them: upstream's host made a ggml context for every tensor it
    // decoded and never freed one. What the heap holds before and after (the host library is in this process).
    apir_rpc_tensor other = f32(2, 1024, 16);
    command set_ok = tensor_io(buffer, small, 64), get_ok = tensor_io(buffer, small, 64), cpy_ok;
    cpy_ok.put<uint64_t>(buffer);
    cpy_ok.put(small);
    cpy_ok.put(other);
    auto round = [&]() {
        return (call(APIR_COMMAND_TYPE_BUFFER_SET_TENSOR, set_ok) != 0) +
               (call(APIR_COMMAND_TYPE_BUFFER_GET_TENSOR, get_ok) != 0) +
               (call(APIR_COMMAND_TYPE_BUFFER_CPY_TENSOR, cpy_ok) != 0);
    };
    const int rounds = 50000;
    int       failed = round();  // once first: whatever a first call sets up for good is not counted
    const size_t held_before = mallinfo2().uordblks;
    for (int i = 0; i < rounds; i++) {
        failed += round();
    }
    const size_t held_after = mallinfo2().uordblks;
    printf("tensor commands: %d sent, %d failed, heap grown by %lld bytes (held before: %zu)\n", 3 * (rounds + 1),
           failed, (long long) held_after - (long long) held_before, held_before);

    // 0020. Several virgl contexts in this one process, as krunkit serves its guest's processes: virglrenderer
    // initializes the library for each context and deinitializes it as each goes. Upstream refused every
    // context after the first (ALREADY_INITED), and the first to go freed every context's buffers.
    auto deinit = (void (*)(uint32_t)) dlsym(lib, "apir_backend_deinit");
    if (!deinit) {
        fprintf(stderr, "graph-run-refusals: no apir_backend_deinit\n");
        return 2;
    }
    // 16 floats of `value` written into that buffer from resource 1 and read back: 0 when they come back
    auto round_trip = [&](uint32_t ctx_id, uint64_t buf, float value) -> int {
        apir_rpc_tensor t = f32(1, 0, 16);
        t.buffer          = buf;
        float in[16], out[16];
        for (float & v : in) {
            v = value;
        }
        memcpy(g_shmem, in, sizeof(in));
        command w = tensor_io(buf, t, sizeof(in)), r = tensor_io(buf, t, sizeof(in));
        if (call(APIR_COMMAND_TYPE_BUFFER_SET_TENSOR, w, ctx_id) != 0) {
            return 1;
        }
        memset(g_shmem, 0, sizeof(out));
        if (call(APIR_COMMAND_TYPE_BUFFER_GET_TENSOR, r, ctx_id) != 0) {
            return 1;
        }
        memcpy(out, g_shmem, sizeof(out));
        return memcmp(in, out, sizeof(in)) != 0;
    };
    printf("context 2 init: %u\n", init(2, &cbs));  // 6: the library's success, as the first context's
    uint64_t of_1 = alloc_for(1), of_2 = alloc_for(2);
    printf("contexts 1 and 2 each with a buffer: %d\n", of_1 && of_2 && !round_trip(1, of_1, 1.5f) &&
                                                          !round_trip(2, of_2, 2.5f));
    deinit(1);
    printf("after context 1 went, context 2's buffer: %d\n", round_trip(2, of_2, 3.5f));  // 0: still its own
    printf("after context 1 went, context 1's buffer: %d\n", round_trip(2, of_1, 4.5f));  // 1: freed, refused
    fprintf(stderr, "graph-run-refusals: the last context goes\n");
    deinit(2);
    fprintf(stderr, "graph-run-refusals: the next context comes\n");
    uint32_t again = init(3, &cbs);  // every context gone: a fresh start
    uint64_t of_3  = alloc_for(3);
    printf("context 3 after all went: init %u, buffer %d\n", again, of_3 ? round_trip(3, of_3, 5.5f) : 1);
    buffer = of_3;  // f32() makes tensors in it: a graph on the backend made afresh
    graph("a graph run by context 3 after a fresh start", { f32(1, 0, 16) }, 0, 3);
    g_big.clear();
    command none_9;  // a context virglrenderer forwards though it was never initialized
    send_as("a command of a context never initialized", APIR_COMMAND_TYPE_DEVICE_GET_BUFFER_TYPE, none_9, 9);
    const char * loaded = g_lib;  // a context of this process naming another ggml library than the one loaded
    g_lib               = "/krun-gpu/another/libggml-cpu.so";
    printf("context 4 asking for another library: init %u\n", init(4, &cbs));  // 13: 6 + ALREADY_INITED
    g_lib = loaded;
    send_as("a command of the refused context", APIR_COMMAND_TYPE_DEVICE_GET_BUFFER_TYPE, none_9, 4);
    deinit(4);  // refused, so it has nothing to free: context 3 keeps the backend
    printf("context 3 after context 4 went: buffer %d\n", round_trip(3, of_3, 6.5f));
    deinit(3);
    return 0;
}
#endif
