// krun-gpu: a run whose outputs, read into guest memory, add up to more than the command's data pages
// (0014). Each read of a waiting run joins it and lands in the command's pages; one that would not fit
// there must go as GET_TENSOR after the run, not make the run ask for one temporary shared resource of
// all of them (a VM's blob window may refuse it, and the guest then aborts). Run with
// APIR_LOOPBACK_BLOB_MAX at the data pages' size, APIR_LOOPBACK_NO_HOST_PTR=1 and APIR_LOOPBACK_STATS:
// tests/apir/test_apir_remoting.py checks that the values are right, that no resource larger than the
// pages was asked for and that the reads that did not fit crossed as GET_TENSOR.
//
//   wide-reads-check DEVICE OUTPUTS MIB RUNS
//
// OUTPUTS tensors of MIB MiB each, out_k = x * (k + 1), read with ggml_backend_tensor_get_async (as
// llama.cpp reads logits and embeddings) and then synchronize, RUNS times (the second run on sends the
// graph by uid, so more of the pages are free for reads).

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "check-backends.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s DEVICE OUTPUTS MIB RUNS\n", argv[0]);
        return 2;
    }
    const int outputs = atoi(argv[2]), mib = atoi(argv[3]), runs = atoi(argv[4]);
    if (outputs <= 0 || outputs > 16 || mib <= 0 || mib > 64 || runs <= 0) {
        fprintf(stderr, "wide-reads-check: OUTPUTS 1-16, MIB 1-64, RUNS positive\n");
        return 2;
    }
    const check_backends started = start_check_backends("wide-reads-check", argv[1]);
    ggml_backend_t       remote  = started.remote;
    ggml_backend_t       cpu     = started.cpu;
    const int64_t n = (int64_t) mib << 18;  // floats in MIB MiB

    ggml_init_params gparams = { (size_t) (2 * outputs + 2) * ggml_tensor_overhead() + ggml_graph_overhead(),
                                 nullptr, true };
    ggml_context *   gctx    = ggml_init(gparams);
    ggml_tensor *    x       = ggml_new_tensor_1d(gctx, GGML_TYPE_F32, n);
    ggml_set_input(x);
    ggml_cgraph *              gf = ggml_new_graph(gctx);
    std::vector<ggml_tensor *> outs;
    for (int k = 0; k < outputs; k++) {
        ggml_tensor * o = ggml_scale(gctx, x, (float) (k + 1));
        ggml_set_output(o);
        ggml_build_forward_expand(gf, o);
        outs.push_back(o);
    }
    ggml_backend_t       backends[2] = { remote, cpu };
    ggml_backend_sched_t sched       = ggml_backend_sched_new(backends, nullptr, 2, 64, false, true);
    for (ggml_tensor * o : outs) {  // no weights to pull them there: placed by hand
        ggml_backend_sched_set_tensor_backend(sched, o, remote);
    }
    if (!ggml_backend_sched_alloc_graph(sched, gf)) {
        fprintf(stderr, "wide-reads-check: cannot allocate the graph\n");
        return 1;
    }
    for (ggml_tensor * o : outs) {
        if (ggml_backend_sched_get_tensor_backend(sched, o) != remote) {
            fprintf(stderr, "wide-reads-check: an output was not placed on %s\n", argv[1]);
            return 1;
        }
    }

    std::vector<float>              xv(n);
    std::vector<std::vector<float>> got(outputs, std::vector<float>(n));  // plain guest memory
    long                            bad = 0;
    for (int r = 0; r < runs; r++) {
        for (int64_t i = 0; i < n; i++) {
            xv[i] = (float) ((i * 7 + r * 13) % 29 - 14);
        }
        ggml_backend_tensor_set(x, xv.data(), 0, sizeof(float) * n);
        if (ggml_backend_sched_graph_compute_async(sched, gf) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "wide-reads-check: compute failed at run %d\n", r);
            return 1;
        }
        for (int k = 0; k < outputs; k++) {
            ggml_backend_tensor_get_async(remote, outs[k], got[k].data(), 0, sizeof(float) * n);
        }
        ggml_backend_sched_synchronize(sched);
        for (int k = 0; k < outputs; k++) {
            for (int64_t i = 0; i < n; i++) {
                if (got[k][i] != xv[i] * (float) (k + 1) && bad++ < 5) {  // exact: small integers times k + 1
                    fprintf(stderr, "run %d output %d [%lld]: %f, want %f\n", r, k, (long long) i, got[k][i],
                            xv[i] * (float) (k + 1));
                }
            }
        }
    }
    printf("wide-reads-check: %d runs of %d outputs of %d MiB on %s, %ld wrong values\n", runs, outputs, mib, argv[1],
           bad);
    ggml_backend_sched_free(sched);
    ggml_free(gctx);
    ggml_backend_free(cpu);
    ggml_backend_free(remote);
    return bad == 0 ? 0 : 1;
}
