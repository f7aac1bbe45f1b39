// krun-gpu: does the guest reserve for each tensor what the host's buffer type asks for (patch 0010)?
//
// ggml-alloc sizes a tensor while it has no buffer yet (each weight of a model load, each node of a
// graph), through the buffer type's get_alloc_size. ggml-cuda answers more than ggml_nbytes for
// quantized tensors whose rows need padding (and for some ops); a frontend that answers ggml_nbytes
// itself lets a tensor's padding overlap the next tensor. The loopback's host can be told to pad
// quantized tensors (APIR_LOOPBACK_ALLOC_PAD=PAD, the CPU buffer type never pads by itself); this
// program then checks, on "[virtgpu] <host device>":
//   - get_alloc_size of weights and of graph nodes (with sources) is ggml_nbytes, + PAD if quantized;
//   - the buffer ggml_backend_alloc_ctx_tensors_from_buft makes leaves each tensor that much room;
//   - asking again about the same descriptions costs no round trip (the loopback's profile shows it:
//     tests/apir/test_apir_remoting.py reads APIR_LOOPBACK_STATS).
//
//   alloc-size-check DEVICE PAD      prints the number of distinct descriptions asked about

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE PAD\n", argv[0]);
        return 2;
    }
    const size_t pad = strtoull(argv[2], nullptr, 10);
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name(argv[1]);
    if (!dev) {
        fprintf(stderr, "alloc-size-check: no device %s\n", argv[1]);
        return 2;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);

    // Weights as a model has them: quantized rows of 896 (qwen2's width: no multiple of ggml-cuda's
    // 512-element padding), a norm vector, an F16 matrix; then graph nodes with sources (one quantized).
    ggml_init_params params = { 16 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   ctx    = ggml_init(params);
    std::vector<ggml_tensor *> weights = {
        ggml_new_tensor_2d(ctx, GGML_TYPE_Q8_0, 896, 4),
        ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 896),
        ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_0, 896, 3),
        ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 100, 3),
    };
    ggml_init_params gparams = { 16 * ggml_tensor_overhead(), nullptr, true };
    ggml_context *   gctx    = ggml_init(gparams);
    ggml_tensor *    x       = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, 896, 2);
    std::vector<ggml_tensor *> nodes = { ggml_mul_mat(gctx, weights[0], x), ggml_mul(gctx, x, weights[1]),
                                         ggml_cont(gctx, weights[2]) };
    // What the host's buffer type asks for (the loopback pads quantized tensors, as ggml-cuda does).
    auto want = [&](const ggml_tensor * t) { return ggml_nbytes(t) + (ggml_is_quantized(t->type) ? pad : 0); };

    int bad = 0;
    auto check = [&](const char * what, const ggml_tensor * t, size_t got, bool ok) {
        if (!ok) {
            bad++;
            fprintf(stderr, "%s %s %s %lldx%lld: %zu bytes, want %zu\n", what, ggml_op_name(t->op),
                    ggml_type_name(t->type), (long long) t->ne[0], (long long) t->ne[1], got, want(t));
        }
    };
    for (int round = 0; round < 3; round++) {  // rounds 2 and 3: the same descriptions again
        for (ggml_tensor * t : weights) {
            const size_t got = ggml_backend_buft_get_alloc_size(buft, t);
            check("get_alloc_size of weight", t, got, got == want(t));
        }
        for (ggml_tensor * t : nodes) {
            const size_t got = ggml_backend_buft_get_alloc_size(buft, t);
            check("get_alloc_size of node", t, got, got == want(t));
        }
    }

    // The weights' buffer, as a model load makes it: each tensor must have its padded size to itself
    // (the buffer's alignment may leave more).
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (!buf) {
        fprintf(stderr, "alloc-size-check: cannot allocate the weights on %s\n", argv[1]);
        return 1;
    }
    const char * end = (const char *) ggml_backend_buffer_get_base(buf) + ggml_backend_buffer_get_size(buf);
    for (size_t i = 0; i < weights.size(); i++) {
        const char * next = i + 1 < weights.size() ? (const char *) weights[i + 1]->data : end;
        const size_t room = (size_t) (next - (const char *) weights[i]->data);
        check("room in the buffer for weight", weights[i], room, room >= want(weights[i]));
    }
    printf("alloc-size-check: %zu descriptions on %s, %d wrong sizes\n", weights.size() + nodes.size(), argv[1], bad);

    ggml_backend_buffer_free(buf);
    ggml_free(gctx);
    ggml_free(ctx);
    return bad == 0 ? 0 : 1;
}
