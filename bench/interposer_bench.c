/*
 * Times the driver calls the interposer wraps, one by one: cuMemAlloc_v2 + cuMemFree_v2
 * of 1 MiB, and cuLaunchKernel of an empty kernel. Prints "<call> <p50 ns> <p99 ns>".
 * Functions come from dlopen("libcuda.so.1") + dlsym, so with libgpushare-cuda.so
 * preloaded they are the hooks. On a real driver the kernel is a PTX no-op; on the fake
 * (no cuModuleLoadData) a NULL function with gridDimX 0, which the fake runs for 0 us.
 *
 * With a second argument LIVE: "cuMemFree_v2@LIVE <p50> <p99>", the cost of a free while
 * LIVE allocations of 4 KiB are held (each timed free is of a random live one, which is
 * then allocated again, untimed).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

static const char ptx[] = ".version 6.0\n.target sm_50\n.address_size 64\n"
                          ".visible .entry noop() { ret; }\n";

static long long now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

static void report(const char *call, long long *samples, int n) {
    qsort(samples, (size_t)n, sizeof *samples, by_value);
    printf("%s %lld %lld\n", call, samples[n / 2], samples[n * 99 / 100]);
}

static unsigned long long next_random(unsigned long long *state) {
    *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
    return *state;
}

static int frees_among_live(int n, int live, CUresult (*alloc)(unsigned long long *, size_t),
                            CUresult (*release)(unsigned long long)) {
    unsigned long long *held = malloc(sizeof *held * (size_t)live), state = 88172645463325252ull;
    long long *samples = malloc(sizeof *samples * (size_t)n);
    for (int i = 0; i < live; i++)
        if (alloc(&held[i], 4096))
            return 3;
    for (int i = 0; i < n; i++) {
        int victim = (int)(next_random(&state) % (unsigned long long)live);
        long long t0 = now();
        release(held[victim]);
        samples[i] = now() - t0;
        if (alloc(&held[victim], 4096))
            return 3;
    }
    char call[64];
    snprintf(call, sizeof call, "cuMemFree_v2@%d", live);
    report(call, samples, n);
    return 0;
}

#define NEED(name) name = dlsym(driver, #name); if (!name) { fprintf(stderr, "no %s\n", #name); return 2; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    CUresult (*cuInit)(unsigned), (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
    CUresult (*cuCtxSetCurrent)(CUcontext), (*cuMemAlloc_v2)(unsigned long long *, size_t);
    CUresult (*cuMemFree_v2)(unsigned long long);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, void *, void **, void **);
    NEED(cuInit) NEED(cuDevicePrimaryCtxRetain) NEED(cuCtxSetCurrent) NEED(cuMemAlloc_v2)
    NEED(cuMemFree_v2) NEED(cuLaunchKernel)
    CUresult (*cuModuleLoadData)(CUmodule *, const void *) = dlsym(driver, "cuModuleLoadData");
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *) =
        dlsym(driver, "cuModuleGetFunction");
    CUresult (*cuCtxSynchronize)(void) = dlsym(driver, "cuCtxSynchronize");
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        fprintf(stderr, "no device\n");
        return 2;
    }
    if (argc > 2)
        return frees_among_live(n, atoi(argv[2]), cuMemAlloc_v2, cuMemFree_v2);
    CUfunction kernel = NULL;
    unsigned grid = 0;
    CUmodule module;
    if (cuModuleLoadData && cuModuleGetFunction && cuModuleLoadData(&module, ptx) == 0 &&
        cuModuleGetFunction(&kernel, module, "noop") == 0)
        grid = 1;
    long long *alloc = malloc(sizeof(long long) * (size_t)n);
    long long *release = malloc(sizeof(long long) * (size_t)n);
    long long *launch = malloc(sizeof(long long) * (size_t)n);
    for (int i = 0; i < n; i++) {
        unsigned long long p;
        long long t0 = now();
        if (cuMemAlloc_v2(&p, 1 << 20))
            return 3;
        long long t1 = now();
        cuMemFree_v2(p);
        long long t2 = now();
        alloc[i] = t1 - t0, release[i] = t2 - t1;
    }
    for (int i = 0; i < n; i++) {
        if (cuCtxSynchronize && i % 1000 == 0)
            cuCtxSynchronize(); /* keep the queue short: time the launch, not back-pressure */
        long long t0 = now();
        if (cuLaunchKernel(kernel, grid, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))
            return 4;
        launch[i] = now() - t0;
    }
    report("cuMemAlloc_v2", alloc, n);
    report("cuMemFree_v2", release, n);
    report("cuLaunchKernel", launch, n);
    return 0;
}
