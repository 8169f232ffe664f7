/*
 * Launch pacing: the agent opens and closes each GPU's gate in the region; a launch on
 * a GPU whose gate is closed waits until it opens, or until the time the agent closed it
 * for has passed (an agent that died must not hold a container's launches for ever). The open path is one atomic load
 * after the counters; nothing here makes a system call unless the launch is held.
 *
 * The counters the agent reads (launches, the latest launch, the heartbeat) are shared by
 * every process of the container: written on each launch, their cache line moved between
 * the processes' cores on each launch (+120-150 ns a launch with two processes launching
 * together, against +42 ns for one). Each process counts in its own memory and publishes
 * at most once a PUBLISH_NS, and at exit: the agent reads them once a slice.
 */
#define _GNU_SOURCE
#include <time.h>

#include "hooks.h"
#include "region.h"

#define HOLD_POLL_NS 200000L /* how often a held launch looks at its gate again */
#define PUBLISH_NS 1000000ull /* how stale the shared counters may be: well under a slice */

/* This process's launches not published yet, per GPU, and when it last published. */
static struct {
    uint64_t launches;
    uint64_t last_ns;
    uint64_t published_ns;
} local[GS_MAX_GPUS] __attribute__((aligned(64)));

static void publish(int gpu, uint64_t now) {
    uint64_t count = __atomic_exchange_n(&local[gpu].launches, 0, __ATOMIC_RELAXED);
    struct gs_gpu *g = &gs_region->gpus[gpu];
    if (count)
        __atomic_fetch_add(&g->launches, count, __ATOMIC_RELAXED);
    __atomic_store_n(&g->last_launch_ns, __atomic_load_n(&local[gpu].last_ns, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&gs_region->heartbeat_ns, now, __ATOMIC_RELAXED);
    __atomic_store_n(&local[gpu].published_ns, now, __ATOMIC_RELAXED);
}

void gs_launches_flush(void) {
    if (!gs.active || gs_region == NULL)
        return;
    uint64_t now = gs_now_ns();
    for (int gpu = 0; gpu < GS_MAX_GPUS; gpu++)
        if (__atomic_load_n(&local[gpu].launches, __ATOMIC_RELAXED))
            publish(gpu, now);
}

void gs_launches_forked(void) {
    /* The parent's launches are the parent's to publish. */
    for (int gpu = 0; gpu < GS_MAX_GPUS; gpu++)
        local[gpu].launches = 0, local[gpu].published_ns = 0;
}

/* Closed, and the agent's word on it still stands. */
static int closed(struct gs_gpu *g, uint64_t now) {
    return __atomic_load_n(&g->gate, __ATOMIC_ACQUIRE) == 0 &&
           now < __atomic_load_n(&g->gate_until_ns, __ATOMIC_ACQUIRE);
}

static void hold_until_open(struct gs_gpu *g, uint64_t since) {
    __atomic_fetch_add(&g->launches_held, 1, __ATOMIC_RELAXED);
    struct timespec poll = {0, HOLD_POLL_NS};
    uint64_t now = since;
    while (closed(g, now)) {
        nanosleep(&poll, NULL);
        now = gs_now_ns();
    }
    __atomic_fetch_add(&g->held_ns, now - since, __ATOMIC_RELAXED);
}

static void gate(void) {
    gs_enter_cuda();
    if (!gs.active)
        return;
    CUdevice device;
    if (gs_current_device(&device) != CUDA_SUCCESS)
        return; /* the driver refuses the launch itself */
    int gpu = gs_gpu_of_device(device);
    if (gpu < 0)
        return;
    struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t now = gs_now_ns();
    __atomic_fetch_add(&local[gpu].launches, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&local[gpu].last_ns, now, __ATOMIC_RELAXED);
    if (now - __atomic_load_n(&local[gpu].published_ns, __ATOMIC_RELAXED) >= PUBLISH_NS)
        publish(gpu, now);
    if (UNLIKELY(__atomic_load_n(&g->gate, __ATOMIC_ACQUIRE) == 0) && closed(g, now))
        hold_until_open(g, now);
}

#define LAUNCH(name, ...)                                                      \
    do {                                                                       \
        gate();                                                                \
        return GS_CALL_CUDA(name, __VA_ARGS__);                                \
    } while (0)

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz,
                               unsigned int shared, CUstream stream, void **params,
                               void **extra) {
    LAUNCH(cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int shared, CUstream stream,
                                    void **params, void **extra) {
    LAUNCH(cuLaunchKernel_ptsz, f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                 void **extra) {
    LAUNCH(cuLaunchKernelEx, config, f, params, extra);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra) {
    LAUNCH(cuLaunchKernelEx_ptsz, config, f, params, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                          unsigned int gz, unsigned int bx, unsigned int by,
                                          unsigned int bz, unsigned int shared, CUstream stream,
                                          void **params) {
    LAUNCH(cuLaunchCooperativeKernel, f, gx, gy, gz, bx, by, bz, shared, stream, params);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx, unsigned int by,
                                               unsigned int bz, unsigned int shared,
                                               CUstream stream, void **params) {
    LAUNCH(cuLaunchCooperativeKernel_ptsz, f, gx, gy, gz, bx, by, bz, shared, stream, params);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    LAUNCH(cuGraphLaunch, exec, stream);
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    LAUNCH(cuGraphLaunch_ptsz, exec, stream);
}
