// krun-gpu: greedy decoding through libllama, printing the token ids; the correctness half of the
// APIR remoting bench (bench/apir_remoting.py). Run once on a device through the route and once
// natively: the cut must not change a single token.
//
//   greedy MODEL DEVICE N_TOKENS     DEVICE: a ggml device name ("[virtgpu] CPU", "CUDA0"), or
//                                    "none" for the CPU alone
//
// The prompt is fixed token ids (no tokenizer: synthetic models have no meaningful text), long
// enough that the prompt is one graph and each generated token another, reused from one token to
// the next as llama-bench's tg test does.

#include "ggml-backend.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL DEVICE|none N_TOKENS\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const std::string device = argv[2];
    // The prompt is long enough that its embeddings (PROMPT x n_embd) exceed the 256 KiB a write may wait with:
    // through APIR 0.6 they go by reference (0023). The context holds it and the tokens decoded after it.
    constexpr int PROMPT = 300, CTX = 512;
    const int n_tokens = atoi(argv[3]);
    if (n_tokens <= 0 || n_tokens > CTX - PROMPT) {
        fprintf(stderr, "greedy: N_TOKENS must be a number from 1 to %d (the context holds %d with the prompt's %d)\n",
                CTX - PROMPT, CTX, PROMPT);
        return 2;
    }

    ggml_backend_load_all();
    llama_backend_init();

    ggml_backend_dev_t devices[2] = { nullptr, nullptr };
    llama_model_params mparams = llama_model_default_params();
    if (device == "none") {
        mparams.n_gpu_layers = 0;
        // The CPU's repacked weight layouts (extra buffer types) sum in another order than the plain
        // layout a remote CPU computes on; near-ties of a synthetic model then pick other tokens.
        mparams.use_extra_bufts = false;
    } else {
        devices[0] = ggml_backend_dev_by_name(device.c_str());
        if (!devices[0]) {
            fprintf(stderr, "greedy: no ggml device named %s\n", device.c_str());
            return 1;
        }
        mparams.n_gpu_layers = 999;
    }
    mparams.devices = devices;  // an empty list (none): no device but the CPU

    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (!model) {
        fprintf(stderr, "greedy: cannot load %s\n", model_path);
        return 1;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx      = CTX;
    cparams.n_batch    = CTX;
    cparams.op_offload = device != "none";
    cparams.no_perf    = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        fprintf(stderr, "greedy: cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    std::vector<llama_token> prompt;
    for (int i = 0; i < PROMPT; i++) {
        prompt.push_back((llama_token) ((i * 7919 + 11) % n_vocab));
    }
    llama_batch batch = llama_batch_get_one(prompt.data(), (int32_t) prompt.size());
    llama_token next  = 0;
    for (int i = 0; i < n_tokens; i++) {
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "greedy: llama_decode failed at token %d\n", i);
            return 1;
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int           best   = 0;
        for (int v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[best]) {
                best = v;
            }
        }
        next = (llama_token) best;
        printf("%s%d", i ? " " : "", next);
        batch = llama_batch_get_one(&next, 1);
    }
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
