/*
 * Allocation hooks: every path that takes device memory reserves it in the region
 * before the driver is asked (so a refused request never reaches it), gives it back
 * if the driver fails, and remembers what each pointer or handle holds so its free
 * returns exactly that.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "hooks.h"
#include "region.h"

/* What this process holds, by (kind, pointer or handle). Process-local: a pointer is
 * freed by the process that allocated it. */
enum kind { POINTER, HANDLE, ARRAY, MIPMAP };

struct held {
    struct held *next;
    uint64_t key;
    enum kind kind;
    int gpu;
    uint64_t bytes;
};

#define BUCKETS 4096
static struct held *buckets[BUCKETS];
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;

static unsigned bucket(enum kind kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (unsigned)(h >> 52) % BUCKETS;
}

static void remember(enum kind kind, uint64_t key, int gpu, uint64_t bytes) {
    struct held *h = malloc(sizeof *h);
    if (h == NULL) {
        gs_unreserve(gpu, bytes); /* cannot track it: better uncounted than never freed */
        return;
    }
    *h = (struct held){NULL, key, kind, gpu, bytes};
    unsigned b = bucket(kind, key);
    pthread_mutex_lock(&held_lock);
    h->next = buckets[b];
    buckets[b] = h;
    pthread_mutex_unlock(&held_lock);
}

/* Removes and returns what (kind, key) held; 0 if it was not ours to count. */
static int forget(enum kind kind, uint64_t key, struct held *out) {
    unsigned b = bucket(kind, key);
    pthread_mutex_lock(&held_lock);
    for (struct held **p = &buckets[b]; *p; p = &(*p)->next) {
        if ((*p)->key == key && (*p)->kind == kind) {
            struct held *h = *p;
            *p = h->next;
            pthread_mutex_unlock(&held_lock);
            *out = *h;
            free(h);
            return 1;
        }
    }
    pthread_mutex_unlock(&held_lock);
    return 0;
}

void gs_memory_forked(void) {
    /* The child holds none of its parent's allocations (contexts do not survive fork). */
    for (unsigned b = 0; b < BUCKETS; b++) {
        for (struct held *h = buckets[b], *next; h; h = next) {
            next = h->next;
            free(h);
        }
        buckets[b] = NULL;
    }
    pthread_mutex_init(&held_lock, NULL);
}

/* The region entry of the calling thread's device: its context decides where the
 * allocations without a location go. -1: not capped here. */
static CUresult context_gpu(int *gpu) {
    CUdevice device;
    CUresult rc = gs_current_device(&device);
    if (rc != CUDA_SUCCESS)
        return rc; /* the driver would refuse the allocation for the same reason */
    *gpu = gs_gpu_of_device(device);
    return CUDA_SUCCESS;
}

static int capping(void) { return gs.active; }

/* Reserve before the driver; CUDA_SUCCESS lets the call go on. */
static CUresult admit(int gpu, uint64_t bytes) {
    if (gpu < 0 || gs_reserve(gpu, bytes))
        return CUDA_SUCCESS;
    gs_log(2, "refused %llu bytes on GPU %d: over its cap of %llu (%llu in use)",
           (unsigned long long)bytes, gpu, (unsigned long long)gs_region->gpus[gpu].cap_bytes,
           (unsigned long long)gs_region->gpus[gpu].used_bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* After the driver: keep the reservation with what it allocated, or give it back. */
static CUresult settle(CUresult rc, enum kind kind, uint64_t key, int gpu, uint64_t bytes) {
    if (gpu < 0)
        return rc;
    if (rc == CUDA_SUCCESS)
        remember(kind, key, gpu, bytes);
    else
        gs_unreserve(gpu, bytes);
    return rc;
}

static void release(enum kind kind, uint64_t key, CUresult rc) {
    struct held h;
    if (rc == CUDA_SUCCESS && capping() && forget(kind, key, &h))
        gs_unreserve(h.gpu, h.bytes);
}

#define CALL_REAL(name, ...) (real_##name ? real_##name(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

/* Allocations on the calling thread's device: cuMemAlloc*, cuMemAllocAsync*. */
#define CONTEXT_ALLOCATION(name, kind, key, bytes, ...)                      \
    do {                                                                     \
        gs_enter_cuda();                                                     \
        if (!capping())                                                      \
            return CALL_REAL(name, __VA_ARGS__);                             \
        int gpu;                                                             \
        CUresult rc = context_gpu(&gpu);                                     \
        if (rc == CUDA_SUCCESS)                                              \
            rc = admit(gpu, bytes);                                          \
        if (rc != CUDA_SUCCESS)                                              \
            return rc;                                                       \
        rc = CALL_REAL(name, __VA_ARGS__);                                   \
        return settle(rc, kind, rc == CUDA_SUCCESS ? (key) : 0, gpu, bytes); \
    } while (0)

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc, POINTER, *dptr, bytesize, dptr, bytesize);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc_v2, POINTER, *dptr, bytesize, dptr, bytesize);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    CONTEXT_ALLOCATION(cuMemAllocAsync, POINTER, *dptr, bytesize, dptr, bytesize, stream);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    CONTEXT_ALLOCATION(cuMemAllocAsync_ptsz, POINTER, *dptr, bytesize, dptr, bytesize, stream);
}

/* A pool's device is not asked of the driver (no query gives it); the stream's work runs
 * in the calling thread's context, whose device is charged. */
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream stream) {
    CONTEXT_ALLOCATION(cuMemAllocFromPoolAsync, POINTER, *dptr, bytesize, dptr, bytesize, pool,
                       stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream stream) {
    CONTEXT_ALLOCATION(cuMemAllocFromPoolAsync_ptsz, POINTER, *dptr, bytesize, dptr, bytesize,
                       pool, stream);
}

/* The driver rounds a pitch up to its alignment (at most 512 bytes on any GPU so far):
 * reserve that much, then settle on the pitch it chose, refusing if that is over. */
#define PITCH_ALIGNMENT 512u
static uint64_t pitched(uint64_t width, uint64_t height) {
    return (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT * height;
}

static CUresult settle_pitch(CUresult rc, uint64_t key, int gpu, uint64_t reserved,
                             uint64_t actual, CUresult (*undo)(uint64_t)) {
    if (rc != CUDA_SUCCESS || gpu < 0 || actual <= reserved) {
        if (rc == CUDA_SUCCESS && gpu >= 0)
            gs_unreserve(gpu, reserved - actual);
        return settle(rc, POINTER, key, gpu, rc == CUDA_SUCCESS ? actual : reserved);
    }
    if (gs_reserve(gpu, actual - reserved))
        return settle(rc, POINTER, key, gpu, actual);
    undo(key);
    gs_unreserve(gpu, reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult undo_v1(uint64_t p) { return CALL_REAL(cuMemFree, (CUdeviceptr_v1)p); }
static CUresult undo_v2(uint64_t p) { return CALL_REAL(cuMemFree_v2, (CUdeviceptr)p); }

#define PITCH_ALLOCATION(name, undo, ...)                                                  \
    do {                                                                                   \
        gs_enter_cuda();                                                                   \
        if (!capping())                                                                    \
            return CALL_REAL(name, __VA_ARGS__);                                           \
        int gpu;                                                                           \
        uint64_t reserved = pitched(width, height);                                        \
        CUresult rc = context_gpu(&gpu);                                                   \
        if (rc == CUDA_SUCCESS)                                                            \
            rc = admit(gpu, reserved);                                                     \
        if (rc != CUDA_SUCCESS)                                                            \
            return rc;                                                                     \
        rc = CALL_REAL(name, __VA_ARGS__);                                                 \
        return settle_pitch(rc, rc == CUDA_SUCCESS ? *dptr : 0, gpu, reserved,             \
                            rc == CUDA_SUCCESS ? (uint64_t)*pitch * height : 0, undo);     \
    } while (0)

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch, undo_v1, dptr, pitch, width, height, element_size);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch_v2, undo_v2, dptr, pitch, width, height, element_size);
}

/* cuMemCreate names its location: only device memory is capped; host and NUMA
 * locations pass through untouched (nothing to index with their id). */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    gs_enter_cuda();
    if (!capping() || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CALL_REAL(cuMemCreate, handle, size, prop, flags);
    int gpu = gs_gpu_of_device(prop->location.id);
    CUresult rc = admit(gpu, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CALL_REAL(cuMemCreate, handle, size, prop, flags);
    return settle(rc, HANDLE, rc == CUDA_SUCCESS ? *handle : 0, gpu, size);
}

/* Arrays: the driver does not say what it allocated, so the texels are counted. */
static uint64_t texel_bytes(CUarray_format format, unsigned channels) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * channels;
    default: /* 32-bit formats, and a safe bound for the packed and block ones */
        return 4ull * channels;
    }
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format format,
                            unsigned channels) {
    return w * (h ? h : 1) * (d ? d : 1) * texel_bytes(format, channels);
}

static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    uint64_t total = 0, w = desc->Width, h = desc->Height, d = desc->Depth;
    for (unsigned l = 0; l < levels && (w | h | d); l++) {
        total += array_bytes(w ? w : 1, h, d, desc->Format, desc->NumChannels);
        w >>= 1, h >>= 1, d >>= 1;
    }
    return total;
}

#define ARRAY_ALLOCATION(name, kind, out, bytes_of, ...)                                 \
    do {                                                                                 \
        gs_enter_cuda();                                                                 \
        if (!capping() || desc == NULL || out == NULL)                                   \
            return CALL_REAL(name, __VA_ARGS__);                                         \
        int gpu;                                                                         \
        uint64_t bytes = bytes_of;                                                       \
        CUresult rc = context_gpu(&gpu);                                                 \
        if (rc == CUDA_SUCCESS)                                                          \
            rc = admit(gpu, bytes);                                                      \
        if (rc != CUDA_SUCCESS)                                                          \
            return rc;                                                                   \
        rc = CALL_REAL(name, __VA_ARGS__);                                               \
        return settle(rc, kind, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*out : 0, gpu, \
                      bytes);                                                            \
    } while (0)

EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArrayCreate, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArrayCreate_v2, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate_v2, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                       const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    ARRAY_ALLOCATION(cuMipmappedArrayCreate, MIPMAP, array, mipmap_bytes(desc, levels), array,
                     desc, levels);
}

/* Unified memory migrates to any GPU and can exceed the device: it cannot be held to a
 * cap, so under a region it is refused, as cGPU does, saying so once. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    gs_enter_cuda();
    if (!capping())
        return CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags);
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "gpushare-cuda: cuMemAllocManaged refused: unified memory cannot be "
                        "capped under gpushare (CUDA_ERROR_NOT_SUPPORTED)\n");
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define FREE(name, kind, key, ...)                         \
    do {                                                   \
        gs_enter_cuda();                                   \
        CUresult rc = CALL_REAL(name, __VA_ARGS__);        \
        release(kind, (uint64_t)(key), rc);                \
        return rc;                                         \
    } while (0)

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { FREE(cuMemFree, POINTER, dptr, dptr); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE(cuMemFree_v2, POINTER, dptr, dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync, POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync_ptsz, POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    FREE(cuMemRelease, HANDLE, handle, handle);
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
    FREE(cuArrayDestroy, ARRAY, (uintptr_t)array, array);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    FREE(cuMipmappedArrayDestroy, MIPMAP, (uintptr_t)array, array);
}

/* The container's view: total = min(cap, physical), used = what the container holds,
 * free = what is left of that, and never more than the device has free. */
static CUresult memory_view(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t free_now, total_now;
    CUresult rc = CALL_REAL(cuMemGetInfo_v2, &free_now, &total_now);
    if (rc != CUDA_SUCCESS)
        return rc;
    *free_bytes = free_now, *total_bytes = total_now;
    int gpu;
    if (!capping() || context_gpu(&gpu) != CUDA_SUCCESS || gpu < 0)
        return CUDA_SUCCESS;
    const struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t cap = __atomic_load_n(&g->cap_bytes, __ATOMIC_RELAXED);
    uint64_t used = __atomic_load_n(&g->used_bytes, __ATOMIC_RELAXED);
    uint64_t total = cap && cap < total_now ? cap : total_now;
    uint64_t left = total > used ? total - used : 0;
    *total_bytes = total;
    *free_bytes = left < free_now ? left : free_now;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    gs_enter_cuda();
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t f, t;
    CUresult rc = memory_view(&f, &t);
    if (rc == CUDA_SUCCESS)
        *free_bytes = f, *total_bytes = t;
    return rc;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    gs_enter_cuda();
    if (free_bytes == NULL || total_bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!capping())
        return CALL_REAL(cuMemGetInfo, free_bytes, total_bytes);
    uint64_t f, t;
    CUresult rc = memory_view(&f, &t);
    if (rc == CUDA_SUCCESS) { /* the 32-bit form saturates, as the driver's does */
        *free_bytes = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
        *total_bytes = t > 0xffffffffull ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}
