// checks/h200-apir-cut/copy-speeds.cu: what moving a prompt's inputs costs on this host, by the way they move
// (issue 40: a pp512 run through APIR pays 0.4-1.2 ms more than natively, per run, not per token).
// Natively llama.cpp keeps the CPU side's outputs (the token embeddings, 512 x 896 f32 at pp512; the KQ mask)
// in pinned memory and queues their copy to the GPU. Through APIR the guest copies them into its shared pages,
// and the host copies those pages, which are plain shared memory (a memfd mapping, as virglrenderer's blobs),
// to the GPU. This times each step for the sizes a pp512 run moves: a host memcpy (the guest's copy), and a
// host-to-device copy from pageable, shared (memfd), registered (cudaHostRegister) and pinned
// (cudaMallocHost) memory, and pinning the pages for the one copy (register, copy, unregister: what a host
// that is not told when the guest unmaps a resource could do safely). Medians of many, in microseconds; one
// JSON line per size on stdout.
// Build: nvcc -O2 -o copy-speeds copy-speeds.cu
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

static double median_us(int reps, const std::function<void()> & f) {
    std::vector<double> t;
    f();  // first touch and driver warm-up are not what a steady run pays
    for (int i = 0; i < reps; i++) {
        auto a = std::chrono::steady_clock::now();
        f();
        auto b = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// A memfd of `size` bytes, as virglrenderer makes a blob's pages; exits on failure.
static int new_memfd(const char * name, size_t size) {
    int fd = memfd_create(name, 0);
    if (fd < 0 || ftruncate(fd, (off_t) size) != 0) {
        perror("memfd");
        exit(1);
    }
    return fd;
}

// A shared mapping of the memfd; exits on failure.
static char * map_shared(int fd, size_t size) {
    void * p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return (char *) p;
}

int main() {
    // a token's inputs, the KQ mask (f16, f32), the logits (151,936 f32), the embeddings (512 x 896 f32)
    const size_t sizes[] = { 4096, 512 * 1024, 1024 * 1024, 151936 * 4, 512 * 896 * 4, 4 * 1024 * 1024 };
    const size_t max     = 4 * 1024 * 1024;
    const int    reps    = 200;
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    void * dev = nullptr;
    CHECK(cudaMalloc(&dev, max));
    char * src = (char *) malloc(max);
    memset(src, 1, max);
    int    fd     = new_memfd("apir-shmem", max);
    char * shared = map_shared(fd, max);
    memset(shared, 3, max);
    char * pinned = nullptr;
    CHECK(cudaMallocHost((void **) &pinned, max));
    memset(pinned, 4, max);
    char * registered = (char *) malloc(max);
    memset(registered, 5, max);
    CHECK(cudaHostRegister(registered, max, cudaHostRegisterDefault));
    char * shared_registered = map_shared(fd, max);  // the same pages through a mapping of its own
    const bool shared_pins = cudaHostRegister(shared_registered, max, cudaHostRegisterDefault) == cudaSuccess;
    cudaGetLastError();  // a refused registration is a result here, not an error
    // pinned for each copy: pages of their own, which no other mapping keeps pinned
    char * each = map_shared(new_memfd("apir-shmem-each", max), max);
    memset(each, 6, max);

    auto h2d = [&](const char * from, size_t n) {
        return [=]() {
            CHECK(cudaMemcpyAsync(dev, from, n, cudaMemcpyHostToDevice, stream));
            CHECK(cudaStreamSynchronize(stream));
        };
    };
    auto d2h = [&](char * to, size_t n) {
        return [=]() {
            CHECK(cudaMemcpyAsync(to, dev, n, cudaMemcpyDeviceToHost, stream));
            CHECK(cudaStreamSynchronize(stream));
        };
    };
    for (size_t n : sizes) {
        double host_memcpy = median_us(reps, [&]() { memcpy(shared, src, n); });  // into shared pages
        double pageable    = median_us(reps, h2d(src, n));
        double memfd       = median_us(reps, h2d(shared, n));
        double reg         = median_us(reps, h2d(registered, n));
        double memfd_reg   = shared_pins ? median_us(reps, h2d(shared_registered, n)) : -1;
        double pin         = median_us(reps, h2d(pinned, n));
        double pin_each    = -1;  // -1: the driver refused to register these pages
        if (cudaHostRegister(each, n, cudaHostRegisterDefault) == cudaSuccess) {
            CHECK(cudaHostUnregister(each));
            pin_each = median_us(reps, [&]() {
                CHECK(cudaHostRegister(each, n, cudaHostRegisterDefault));
                h2d(each, n)();
                CHECK(cudaHostUnregister(each));
            });
        } else {
            cudaGetLastError();
        }
        double d2h_memfd   = median_us(reps, d2h(shared, n));  // the logits, into the guest's pages
        double d2h_pin     = median_us(reps, d2h(pinned, n));
        printf("{\"bytes\": %zu, \"host_memcpy_us\": %.1f, \"h2d_pageable_us\": %.1f, \"h2d_memfd_shared_us\": %.1f, "
               "\"h2d_registered_us\": %.1f, \"h2d_memfd_registered_us\": %.1f, \"h2d_pinned_us\": %.1f, "
               "\"register_h2d_unregister_us\": %.1f, \"d2h_memfd_shared_us\": %.1f, \"d2h_pinned_us\": %.1f}\n",
               n, host_memcpy, pageable, memfd, reg, memfd_reg, pin, pin_each, d2h_memfd, d2h_pin);
        fflush(stdout);
    }
    return 0;
}
