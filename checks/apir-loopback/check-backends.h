// krun-gpu: how the loopback's decode checks start: every backend library loaded, the remote device named on the
// command line, and a CPU backend beside it for the scheduler. Exits 2 when there is no such device (the caller's
// mistake) and 1 when a backend does not start (the route's failure), naming the check.
#pragma once

#include "ggml-backend.h"

#include <cstdio>
#include <cstdlib>

struct check_backends {
    ggml_backend_dev_t dev;
    ggml_backend_t     remote;
    ggml_backend_t     cpu;
};

inline check_backends start_check_backends(const char * check, const char * device) {
    ggml_backend_load_all();
    check_backends b = { ggml_backend_dev_by_name(device), nullptr, nullptr };
    if (!b.dev) {
        fprintf(stderr, "%s: no device %s\n", check, device);
        exit(2);
    }
    b.remote = ggml_backend_dev_init(b.dev, nullptr);
    b.cpu    = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
    if (!b.remote || !b.cpu) {
        fprintf(stderr, "%s: cannot start the backends\n", check);
        exit(1);
    }
    return b;
}
