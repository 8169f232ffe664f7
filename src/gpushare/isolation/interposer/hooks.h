/*
 * What the parts of libgpushare-cuda.so share: the hooked prototypes and real-function
 * pointers generated from hooks.def (resolve.c), lazy initialisation (config.c), logging
 * and the clock (log.c), the device map (devices.c).
 */
#ifndef GPUSHARE_HOOKS_H
#define GPUSHARE_HOOKS_H

#include <pthread.h>
#include <stdint.h>

#include "cuda_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* One typedef, one exported prototype and one real pointer per table entry. */
#define CUDA_HOOK(name, params)              \
    typedef CUresult(*name##_fn) params;     \
    EXPORT CUresult name params;             \
    extern name##_fn real_##name;
#define CUDA_REAL(name, params)          \
    typedef CUresult(*name##_fn) params; \
    extern name##_fn real_##name;
#define NVML_HOOK(name, params)              \
    typedef nvmlReturn_t(*name##_fn) params; \
    EXPORT nvmlReturn_t name params;         \
    extern name##_fn real_##name;
#define NVML_REAL(name, params)              \
    typedef nvmlReturn_t(*name##_fn) params; \
    extern name##_fn real_##name;
#include "hooks.def"

/* Calls the real function, or answers as a driver without it would: the one way a hook
 * reaches the driver. */
#define GS_CALL_CUDA(name, ...) (real_##name ? real_##name(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)
#define GS_CALL_NVML(name, ...) \
    (real_##name ? real_##name(__VA_ARGS__) : NVML_ERROR_FUNCTION_NOT_FOUND)

enum gs_family { GS_CUDA, GS_NVML };

struct gs_symbol {
    const char *name;
    void *hook;  /* NULL for a CUDA_REAL / NVML_REAL entry */
    void **real; /* where its real pointer is kept */
    enum gs_family family;
};
extern const struct gs_symbol gs_symbols[];
extern const int gs_symbol_count;
/* Finds the family's real functions in its driver library, once. */
void gs_resolve(enum gs_family family);

/* Process state, set once by gs_enter()'s initialisation. */
struct gs_state {
    int active;    /* a region is mapped: caps and gates apply */
    int log_level; /* GPUSHARE_CUDA_LOG: 0 silent .. 3 every decision */
    /* Not NULL: why this process cannot enforce the node's caps (a bad grant, cap or
     * region, no free slot). It fails closed: every allocation is refused. */
    const char *refusing;
};
extern struct gs_state gs;

/* Fails closed for the rest of the process, logging why once (level 1). */
void gs_refuse(const char *format, ...) __attribute__((format(printf, 1, 2)));

/* What a process that fails closed leaves in its accounting directory (refusals.c): the
 * directory is the region's, known before anything can fail on it; begin makes the
 * process's refusing-<pid> file saying why; count adds an allocation refused to it. */
void gs_refusals_beside(const char *region_path);
void gs_refusals_begin(const char *why);
void gs_refusals_count(void);

/* Every hook starts here: reads the environment and resolves the real driver on the
 * first call, reattaches a forked child; afterwards one load and a branch. */
void gs_enter_cuda(void);
void gs_enter_nvml(void);

void gs_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

struct gs_config;
/* The container's GPUs the device map answers with, copied once before gs.active is set. */
void gs_devices_map(const struct gs_config *config);
/* Whether the container's GPUs are named by UUID (else by ordinal). */
int gs_devices_by_uuid(void);
/* The region GPU index of a CUDA device / NVML handle, or -1: not one of the container's
 * (allocations on it are refused) or nothing is enforced. */
int gs_gpu_of_device(CUdevice device);
int gs_gpu_of_nvml(nvmlDevice_t device);

/* The calling thread's current device, as the driver says. */
CUresult gs_current_device(CUdevice *device);

/* The real dlsym (glibc's), found on first use. */
extern void *(*gs_real_dlsym)(void *, const char *);
void gs_resolve_dlsym(void);
const struct gs_symbol *gs_symbol_named(const char *name);

uint64_t gs_now_ns(void);

/* In a forked child: forget the parent's allocations (they are not the child's). */
void gs_memory_forked(void);

/* Launch counts kept in process memory: published to the region now (at exit), and
 * forgotten in a forked child (the parent publishes its own). */
void gs_launches_flush(void);
void gs_launches_forked(void);

#endif
