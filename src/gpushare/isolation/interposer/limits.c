/*
 * Context limits that take device memory: cuCtxSetLimit makes the driver reserve the
 * device-side malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE, bytes per context) and a stack for
 * every thread the device can hold resident (CU_LIMIT_STACK_SIZE, bytes per thread, times
 * multiprocessors x threads per multiprocessor: 64 KiB on a 132-SM GPU of 2,048 threads
 * per SM is 17 GiB). What a raise reserves beyond the limits the driver started with (its
 * defaults, 8 MiB of heap and 1 KiB of stack: context memory, which the agent's backstop
 * slack covers) is counted against the cap of the calling thread's device before the
 * driver is asked, and given back when the limit is lowered, or with the process's slot
 * when it ends.
 *
 * Kept per (process, device) and limit, not per context: a second context of the device
 * raising the same limit replaces the first one's count rather than adding to it, and a
 * destroyed context's count stays until the limit is lowered or the process exits.
 */
#include <string.h>

#include "memory.h"
#include "region.h"

enum { STACK, HEAP, COUNTED_LIMITS };

struct limit_books {
    int known;        /* baseline read */
    size_t baseline;  /* the limit the driver had when first asked: its default */
    uint64_t charged; /* counted now: what the limit reserves beyond the baseline's */
};
static struct limit_books books[GS_MAX_GPUS][COUNTED_LIMITS];
/* Held across the driver calls of a change, so that a device's limit and its count move
 * together; cuCtxSetLimit is rare, and nothing else waits on it. */
static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;

void gs_limits_forked(void) {
    /* The child has no contexts; its slot starts empty. */
    memset(books, 0, sizeof books);
    pthread_mutex_init(&limits_lock, NULL);
}

/* Bytes of device memory per unit of `limit` on `device`: 1 for the heap, the threads the
 * device holds resident for the stack. */
static CUresult bytes_per_unit(CUlimit limit, CUdevice device, uint64_t *per_unit) {
    *per_unit = 1;
    if (limit != CU_LIMIT_STACK_SIZE)
        return CUDA_SUCCESS;
    int sms = 0, threads = 0;
    CUresult rc = GS_CALL_CUDA(cuDeviceGetAttribute, &sms,
                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
    if (rc == CUDA_SUCCESS)
        rc = GS_CALL_CUDA(cuDeviceGetAttribute, &threads,
                          CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device);
    if (rc == CUDA_SUCCESS && (sms <= 0 || threads <= 0))
        rc = CUDA_ERROR_INVALID_VALUE; /* a device that says nothing useful is not trusted */
    if (rc == CUDA_SUCCESS)
        *per_unit = (uint64_t)sms * (uint64_t)threads;
    return rc;
}

/* What `value` reserves beyond `baseline`; UINT64_MAX when that does not fit in 64 bits
 * (no cap allows it). */
static uint64_t beyond(size_t value, size_t baseline, uint64_t per_unit) {
    uint64_t bytes;
    if (value <= baseline)
        return 0;
    if (__builtin_mul_overflow((uint64_t)(value - baseline), per_unit, &bytes))
        return UINT64_MAX;
    return bytes;
}

static CUresult set_limit_locked(CUlimit limit, size_t value, int gpu, uint64_t per_unit) {
    size_t current;
    CUresult rc = GS_CALL_CUDA(cuCtxGetLimit, &current, limit);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (gpu < 0) /* not the container's GPU: nothing to count a raise against */
        return value <= current ? GS_CALL_CUDA(cuCtxSetLimit, limit, value) : gs_admit(gpu, 0);
    struct limit_books *b = &books[gpu][limit == CU_LIMIT_STACK_SIZE ? STACK : HEAP];
    if (!b->known)
        b->known = 1, b->baseline = current;
    uint64_t extra = beyond(value, b->baseline, per_unit), before = b->charged;
    if (extra > before && (rc = gs_admit(gpu, extra - before)) != CUDA_SUCCESS)
        return rc; /* as the driver answers when it cannot reserve that much */
    rc = GS_CALL_CUDA(cuCtxSetLimit, limit, value);
    if (rc == CUDA_SUCCESS)
        b->charged = extra;
    /* Reserved now: the larger of the two counts; keep what the limit holds. */
    uint64_t reserved = extra > before ? extra : before;
    if (reserved > b->charged)
        gs_unreserve(gpu, reserved - b->charged);
    gs_log(3, "cuCtxSetLimit(%s, %zu) on GPU %d: rc %d, %llu bytes counted beyond the default",
           limit == CU_LIMIT_STACK_SIZE ? "stack" : "heap", value, gpu, rc,
           (unsigned long long)b->charged);
    return rc;
}

/* Only the heap and the stack are counted; the printf FIFO (1 MiB by default) and the
 * limits that take no memory pass through. */
EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    gs_enter_cuda();
    if (!gs_capping() || (limit != CU_LIMIT_STACK_SIZE && limit != CU_LIMIT_MALLOC_HEAP_SIZE))
        return GS_CALL_CUDA(cuCtxSetLimit, limit, value);
    CUdevice device;
    uint64_t per_unit;
    CUresult rc = gs_current_device(&device);
    if (rc == CUDA_SUCCESS)
        rc = bytes_per_unit(limit, device, &per_unit);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&limits_lock);
    rc = set_limit_locked(limit, value, gs_gpu_of_device(device), per_unit);
    pthread_mutex_unlock(&limits_lock);
    return rc;
}
