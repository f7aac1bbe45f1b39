// krun-gpu: a decode loop as llama.cpp drives it, on "[virtgpu] <host device>" through the loopback,
// checked value by value against plain C++ arithmetic (APIR 0.3, patches 0006-0008; 0.4, 0011-0014;
// 0.5, 0015-0017: it prints the graph's use counts, which the loopback's stats must show the host got).
//
// The weights are set once; then, token after token, the input is set, the same scheduled graph
// computed again (ggml_backend_sched keeps its uid, so the guest sends the uid, not the graph) and
// the output read back as llama.cpp reads its logits: ggml_backend_tensor_get_async, then synchronize.
// Every token's output must match; with APIR_LOOPBACK_STATS the loopback counts what crossed
// (tests/apir/test_apir_remoting.py reads it: no SET_TENSOR, no GET_TENSOR, one GRAPH_RUN per token).
//
//   graph-run-check DEVICE TOKENS [tokens|ubatches|guest-memory|sync|prompt]
//
// tokens (the default): each token's output is read into the same place of a buffer of the device's host
// buffer type, where llama.cpp keeps its logits (0014: the host writes there itself).
// ubatches: tokens go in pairs, as llama.cpp decodes a batch of two ubatches with one graph, each output
// read into its own half of one such buffer and both checked once the pair is done: an output the route
// brought back for the wrong half, or wrote over the first half's, shows as wrong values.
// guest-memory: as tokens, into plain guest memory (the outputs land in the command's pages, copied).
// sync: as guest-memory, with a synchronous compute and ggml_backend_tensor_get (test-backend-ops' way).
// prompt: each "token" is a prompt of PROMPT columns, its input (384 KiB, more than a write may wait with) made on
// the CPU side into a buffer of the device's host buffer type, as llama.cpp makes a prompt's embeddings and KQ
// mask, and copied to the device by ggml_backend_sched (APIR 0.6: by reference, 0022-0024); outputs as tokens.

#include "ggml-alloc.h"
#include "ggml-impl.h"  // struct ggml_cgraph and ggml_node_get_use_count: the counts the host must get (0015)
#include "ggml-backend.h"
#include "ggml.h"
#include "check-backends.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int N      = 96;    // rows and columns of the weight
constexpr int PROMPT = 1024;  // columns of a prompt's input: N x PROMPT f32, 384 KiB

float value(int i, int salt) {
    return (float) ((i * 37 + salt * 11) % 17 - 8) / 8.0f;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s DEVICE TOKENS [tokens|ubatches|guest-memory|sync|prompt]\n", argv[0]);
        return 2;
    }
    const int         tokens   = atoi(argv[2]);
    const std::string mode     = argc == 4 ? argv[3] : "tokens";
    const bool        ubatches = mode == "ubatches";
    const bool        prompt   = mode == "prompt";
    const bool        in_host  = mode == "tokens" || ubatches || prompt;
    const bool        sync     = mode == "sync";
    const int         cols     = prompt ? PROMPT : 1;  // an input's columns
    if (!in_host && !sync && mode != "guest-memory") {
        fprintf(stderr, "graph-run-check: tokens, ubatches, guest-memory, sync or prompt, not %s\n", mode.c_str());
        return 2;
    }
    if (tokens <= 0) {
        fprintf(stderr, "graph-run-check: TOKENS must be positive, not %s\n", argv[2]);
        return 2;
    }
    const check_backends started = start_check_backends("graph-run-check", argv[1]);
    ggml_backend_dev_t   dev     = started.dev;
    ggml_backend_t       remote  = started.remote;
    ggml_backend_t       cpu     = started.cpu;

    // The weights, in a buffer of the remote device, set once (as a model load does).
    ggml_init_params wparams = { 4 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   wctx    = ggml_init(wparams);
    ggml_tensor *    w       = ggml_new_tensor_2d(wctx, GGML_TYPE_F32, N, N);
    ggml_tensor *    b       = ggml_new_tensor_1d(wctx, GGML_TYPE_F32, N);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors(wctx, remote);
    std::vector<float> wv(N * N), bv(N);
    for (int i = 0; i < N * N; i++) {
        wv[i] = value(i, 1);
    }
    for (int i = 0; i < N; i++) {
        bv[i] = value(i, 2);
    }
    ggml_backend_tensor_set(w, wv.data(), 0, sizeof(float) * wv.size());
    ggml_backend_tensor_set(b, bv.data(), 0, sizeof(float) * bv.size());

    // y = relu(W x + b) * 0.5: one graph, scheduled once, computed once per token.
    ggml_init_params gparams = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context *   gctx    = ggml_init(gparams);
    ggml_tensor *    x_in    = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, N, cols);
    ggml_set_input(x_in);
    ggml_tensor * y_out = ggml_scale(gctx, ggml_relu(gctx, ggml_add(gctx, ggml_mul_mat(gctx, w, x_in), b)), 0.5f);
    ggml_set_output(y_out);
    ggml_cgraph * gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, y_out);

    // prompt: the CPU side's buffers of the device's host buffer type, as llama.cpp asks for them
    ggml_backend_buffer_type_t host_buft   = ggml_backend_dev_host_buffer_type(dev);
    ggml_backend_t             backends[2] = { remote, cpu };
    ggml_backend_buffer_type_t bufts[2]    = { ggml_backend_get_default_buffer_type(remote), host_buft };
    ggml_backend_sched_t sched = ggml_backend_sched_new(backends, prompt ? bufts : nullptr, 2, 64, false, true);
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        fprintf(stderr, "graph-run-check: cannot allocate the graph\n");
        return 1;
    }
    if (ggml_backend_sched_get_tensor_backend(sched, y_out) != remote) {
        fprintf(stderr, "graph-run-check: the graph was not placed on %s\n", argv[1]);
        return 1;
    }
    if (prompt && (!x_in->buffer || ggml_backend_buffer_get_type(x_in->buffer) != host_buft)) {
        fprintf(stderr, "graph-run-check: the prompt's input is not in a host buffer of %s\n", argv[1]);
        return 1;
    }

    int bad = 0;
    std::vector<float> xv(2 * N), guest_out(2 * N);  // a pair's two inputs and two outputs (ubatches)
    float *            out  = guest_out.data();
    ggml_backend_buffer_t obuf = nullptr;
    if (in_host) {  // where llama.cpp keeps its outputs: the output device's host buffer type
        obuf = host_buft ? ggml_backend_buft_alloc_buffer(host_buft, 2 * N * cols * sizeof(float)) : nullptr;
        if (!obuf || ggml_backend_buffer_get_type(obuf) != host_buft) {
            fprintf(stderr, "graph-run-check: %s has no host buffer of its own type\n", argv[1]);
            return 1;
        }
        out = (float *) ggml_backend_buffer_get_base(obuf);
    }
    auto check = [&](int t, const float * x, const float * y) {
        for (int r = 0; r < N; r++) {
            double acc = bv[r];
            for (int c = 0; c < N; c++) {
                acc += (double) wv[r * N + c] * x[c];
            }
            const double want = 0.5 * (acc > 0 ? acc : 0);
            if (std::fabs(want - y[r]) > 1e-3 * (1 + std::fabs(want))) {
                if (bad++ < 5) {
                    fprintf(stderr, "token %d row %d: %f, want %f\n", t, r, y[r], want);
                }
            }
        }
    };
    for (int t = 0; t < tokens; t++) {
        const int half = ubatches ? t % 2 : 0;
        float *   x    = prompt ? (float *) x_in->data : xv.data() + half * N;  // prompt: made in place
        float *   y    = out + half * N;
        for (int i = 0; i < N * cols; i++) {
            x[i] = value(i, 3 + t);
        }
        if (!prompt) {
            ggml_backend_tensor_set(x_in, x, 0, sizeof(float) * N);
        }
        if (sync) {
            if (ggml_backend_sched_graph_compute(sched, gf) != GGML_STATUS_SUCCESS) {
                fprintf(stderr, "graph-run-check: compute failed at token %d\n", t);
                return 1;
            }
            ggml_backend_tensor_get(y_out, y, 0, sizeof(float) * N * cols);
        } else {
            if (ggml_backend_sched_graph_compute_async(sched, gf) != GGML_STATUS_SUCCESS) {
                fprintf(stderr, "graph-run-check: compute failed at token %d\n", t);
                return 1;
            }
            ggml_backend_tensor_get_async(remote, y_out, y, 0, sizeof(float) * N * cols);
            ggml_backend_sched_synchronize(sched);
        }
        if (!ubatches) {
            for (int c = 0; c < cols; c++) {
                check(t, x + c * N, y + c * N);
            }
        } else if (half == 1 || t == tokens - 1) {  // the pair is done: both halves still hold their own
            for (int h = 0; h <= half; h++) {
                check(t - half + h, xv.data() + h * N, out + h * N);
            }
        }
    }
    printf("graph-run-check: %d tokens on %s, %d wrong values\n", tokens, argv[1], bad);
    long uses = 0;  // what a backend given this graph natively sees; the host's graph must see the same
    for (int i = 0; i < ggml_graph_n_nodes(gf); i++) {
        uses += ggml_node_get_use_count(gf, i);
    }
    printf("graph-run-check: the graph's %d nodes have %ld uses\n", ggml_graph_n_nodes(gf), uses);

    if (obuf) {
        ggml_backend_buffer_free(obuf);
    }
    ggml_backend_sched_free(sched);
    ggml_free(gctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(cpu);
    ggml_backend_free(remote);
    return bad == 0 ? 0 : 1;
}
