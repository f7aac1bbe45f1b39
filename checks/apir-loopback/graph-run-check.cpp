// krun-gpu: a decode loop as llama.cpp drives it, on "[virtgpu] <host device>" through the loopback,
// checked value by value against plain C++ arithmetic (APIR 0.3, patches 0006-0008; 0.4, 0011-0013).
//
// The weights are set once; then, token after token, the input is set, the same scheduled graph
// computed again (ggml_backend_sched keeps its uid, so the guest sends the uid, not the graph) and
// the output read back. Every token's output must match; with APIR_LOOPBACK_STATS the loopback
// counts what crossed (tests/apir/test_apir_remoting.py reads it: no SET_TENSOR, one GRAPH_RUN per
// token, and under APIR 0.4 no GET_TENSOR: the output comes back with the graph run).
//
//   graph-run-check DEVICE TOKENS [guest|host]
//
// guest (the default): the output is read into plain guest memory; host: into a buffer of the
// device's host buffer type, as llama.cpp keeps its logits (under APIR 0.4, shared pages the host
// writes directly).

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr int N = 96;  // rows and columns of the weight

float value(int i, int salt) {
    return (float) ((i * 37 + salt * 11) % 17 - 8) / 8.0f;
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s DEVICE TOKENS [guest|host]\n", argv[0]);
        return 2;
    }
    const int  tokens  = atoi(argv[2]);
    const bool to_host = argc == 4 && std::string(argv[3]) == "host";
    if (argc == 4 && !to_host && std::string(argv[3]) != "guest") {
        fprintf(stderr, "graph-run-check: read into guest or host, not %s\n", argv[3]);
        return 2;
    }
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(argv[1]);
    if (!dev || tokens <= 0) {
        fprintf(stderr, "graph-run-check: no device %s (or TOKENS not positive)\n", argv[1]);
        return 2;
    }
    ggml_backend_t remote = ggml_backend_dev_init(dev, nullptr);
    ggml_backend_t cpu    = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!remote || !cpu) {
        fprintf(stderr, "graph-run-check: cannot start the backends\n");
        return 1;
    }

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
    ggml_tensor *    x       = ggml_new_tensor_1d(gctx, GGML_TYPE_F32, N);
    ggml_set_input(x);
    ggml_tensor * y = ggml_scale(gctx, ggml_relu(gctx, ggml_add(gctx, ggml_mul_mat(gctx, w, x), b)), 0.5f);
    ggml_set_output(y);
    ggml_cgraph * gf = ggml_new_graph(gctx);
    ggml_build_forward_expand(gf, y);

    ggml_backend_t       backends[2] = { remote, cpu };
    ggml_backend_sched_t sched       = ggml_backend_sched_new(backends, nullptr, 2, 64, false, true);
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        fprintf(stderr, "graph-run-check: cannot allocate the graph\n");
        return 1;
    }
    if (ggml_backend_sched_get_tensor_backend(sched, y) != remote) {
        fprintf(stderr, "graph-run-check: the graph was not placed on %s\n", argv[1]);
        return 1;
    }

    // Where the output is read to: plain memory, or the device's host buffer (llama.cpp's output buffer).
    std::vector<float>    plain(N);
    float *               yv   = plain.data();
    ggml_backend_buffer_t hbuf = nullptr;
    if (to_host) {
        ggml_backend_buffer_type_t hbuft = ggml_backend_dev_host_buffer_type(dev);
        hbuf = hbuft ? ggml_backend_buft_alloc_buffer(hbuft, sizeof(float) * N) : nullptr;
        if (!hbuf) {
            fprintf(stderr, "graph-run-check: %s has no host buffer type\n", argv[1]);
            return 1;
        }
        yv = (float *) ggml_backend_buffer_get_base(hbuf);
        printf("graph-run-check: output read into a %s buffer\n", ggml_backend_buft_name(hbuft));
    }

    int bad = 0;
    std::vector<float> xv(N);
    for (int t = 0; t < tokens; t++) {
        for (int i = 0; i < N; i++) {
            xv[i] = value(i, 3 + t);
        }
        ggml_backend_tensor_set(x, xv.data(), 0, sizeof(float) * N);
        if (ggml_backend_sched_graph_compute(sched, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "graph-run-check: compute failed at token %d\n", t);
            return 1;
        }
        ggml_backend_tensor_get(y, yv, 0, sizeof(float) * N);
        for (int r = 0; r < N; r++) {
            double acc = bv[r];
            for (int c = 0; c < N; c++) {
                acc += (double) wv[r * N + c] * xv[c];
            }
            const double want = 0.5 * (acc > 0 ? acc : 0);
            if (std::fabs(want - yv[r]) > 1e-3 * (1 + std::fabs(want))) {
                if (bad++ < 5) {
                    fprintf(stderr, "token %d row %d: %f, want %f\n", t, r, yv[r], want);
                }
            }
        }
    }
    printf("graph-run-check: %d tokens on %s, %d wrong values\n", tokens, argv[1], bad);

    if (hbuf) {
        ggml_backend_buffer_free(hbuf);
    }
    ggml_backend_sched_free(sched);
    ggml_free(gctx);
    ggml_backend_buffer_free(wbuf);
    ggml_free(wctx);
    ggml_backend_free(cpu);
    ggml_backend_free(remote);
    return bad == 0 ? 0 : 1;
}
