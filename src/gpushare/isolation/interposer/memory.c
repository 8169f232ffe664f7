/*
 * Plain allocations and their frees: every path that takes device memory reserves it in
 * the region before the driver is asked (so a refused request never reaches it), gives
 * it back if the driver fails, and remembers what each pointer or array holds (held.c)
 * so its free returns exactly that. Here too the admission the other memory hooks share.
 */
#include "memory.h"
#include "region.h"

/* The region entry of the calling thread's device: its context decides where the
 * allocations without a location go. -1: not capped here. */
CUresult gs_context_gpu(int *gpu) {
    CUdevice device;
    CUresult rc = gs_current_device(&device);
    if (rc != CUDA_SUCCESS)
        return rc; /* the driver would refuse the allocation for the same reason */
    *gpu = gs_gpu_of_device(device);
    return CUDA_SUCCESS;
}

int gs_capping(void) { return gs.active || gs.refusing != NULL; }

/* Before a request the cap would refuse while pools keep memory: ask the driver what they
 * still hold (a synchronize the library did not see may have released it). */
static void make_room(int gpu, uint64_t bytes) {
    if (gs_region == NULL || gs_pools_keeping() == 0)
        return;
    const struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t cap = gs_cap(gpu);
    uint64_t used = __atomic_load_n(&g->used_bytes, __ATOMIC_RELAXED);
    if (cap && (used > cap || bytes > cap - used))
        gs_pools_settle();
}

/* A process that fails closed, or a GPU that is not the container's, is refused
 * (config.c or devices.c said why, once); the former counted where the node sees it. */
CUresult gs_admit(int gpu, uint64_t bytes) {
    if (gs.refusing != NULL) {
        gs_refusals_count();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (gpu < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    make_room(gpu, bytes);
    if (gs_reserve(gpu, bytes))
        return CUDA_SUCCESS;
    gs_log(2, "refused %llu bytes on GPU %d: over its cap of %llu (%llu in use)",
           (unsigned long long)bytes, gpu, (unsigned long long)gs_cap(gpu),
           (unsigned long long)gs_region->gpus[gpu].used_bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult gs_settle(CUresult rc, enum gs_kind kind, uint64_t key, int gpu, uint64_t bytes) {
    if (gpu < 0)
        return rc;
    if (rc == CUDA_SUCCESS)
        gs_remember(kind, key, gpu, bytes);
    else
        gs_unreserve(gpu, bytes);
    return rc;
}

void gs_memory_forked(void) {
    gs_held_forked();
    gs_pools_forked();
    gs_limits_forked();
}

/* A free gives back what the table says the pointer or array holds; a pool's, to its pool. */
static void release(enum gs_kind kind, uint64_t key, CUresult rc) {
    if (rc != CUDA_SUCCESS || !gs_capping())
        return;
    pthread_mutex_lock(&gs_held_lock);
    struct gs_held *h = gs_held_find(kind, key);
    int gpu = h ? h->gpu : -1;
    uint64_t back = h == NULL  ? 0
                    : h->link ? gs_pool_returned_locked(h->link, h->bytes)
                              : h->bytes;
    if (h != NULL)
        gs_held_erase(h);
    pthread_mutex_unlock(&gs_held_lock);
    if (back)
        gs_unreserve(gpu, back);
}

/* Allocations on the calling thread's device: cuMemAlloc*. */
#define CONTEXT_ALLOCATION(name, kind, key, bytes, ...)                         \
    do {                                                                        \
        gs_enter_cuda();                                                        \
        if (!gs_capping())                                                      \
            return GS_CALL_CUDA(name, __VA_ARGS__);                             \
        int gpu;                                                                \
        CUresult rc = gs_context_gpu(&gpu);                                     \
        if (rc == CUDA_SUCCESS)                                                 \
            rc = gs_admit(gpu, bytes);                            \
        if (rc != CUDA_SUCCESS)                                                 \
            return rc;                                                          \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                   \
        return gs_settle(rc, kind, rc == CUDA_SUCCESS ? (key) : 0, gpu, bytes); \
    } while (0)

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc, GS_POINTER, *dptr, bytesize, dptr, bytesize);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc_v2, GS_POINTER, *dptr, bytesize, dptr, bytesize);
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
        return gs_settle(rc, GS_POINTER, key, gpu, rc == CUDA_SUCCESS ? actual : reserved);
    }
    if (gs_reserve(gpu, actual - reserved))
        return gs_settle(rc, GS_POINTER, key, gpu, actual);
    undo(key);
    gs_unreserve(gpu, reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult undo_v1(uint64_t p) { return GS_CALL_CUDA(cuMemFree, (CUdeviceptr_v1)p); }
static CUresult undo_v2(uint64_t p) { return GS_CALL_CUDA(cuMemFree_v2, (CUdeviceptr)p); }

#define PITCH_ALLOCATION(name, undo, ...)                                              \
    do {                                                                               \
        gs_enter_cuda();                                                               \
        if (!gs_capping())                                                             \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                    \
        int gpu;                                                                       \
        uint64_t reserved = pitched(width, height);                                    \
        CUresult rc = gs_context_gpu(&gpu);                                            \
        if (rc == CUDA_SUCCESS)                                                        \
            rc = gs_admit(gpu, reserved);                                \
        if (rc != CUDA_SUCCESS)                                                        \
            return rc;                                                                 \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                          \
        return settle_pitch(rc, rc == CUDA_SUCCESS ? *dptr : 0, gpu, reserved,         \
                            rc == CUDA_SUCCESS ? (uint64_t)*pitch * height : 0, undo); \
    } while (0)

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch, undo_v1, dptr, pitch, width, height, element_size);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch_v2, undo_v2, dptr, pitch, width, height, element_size);
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

#define ARRAY_ALLOCATION(name, kind, out, bytes_of, ...)                                    \
    do {                                                                                    \
        gs_enter_cuda();                                                                    \
        if (!gs_capping() || desc == NULL || out == NULL)                                   \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                         \
        int gpu;                                                                            \
        uint64_t bytes = bytes_of;                                                          \
        CUresult rc = gs_context_gpu(&gpu);                                                 \
        if (rc == CUDA_SUCCESS)                                                             \
            rc = gs_admit(gpu, bytes);                                        \
        if (rc != CUDA_SUCCESS)                                                             \
            return rc;                                                                      \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                               \
        return gs_settle(rc, kind, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*out : 0, gpu, \
                      bytes);                                                               \
    } while (0)

EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArrayCreate, GS_ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArrayCreate_v2, GS_ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate, GS_ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate_v2, GS_ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                       const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    ARRAY_ALLOCATION(cuMipmappedArrayCreate, GS_MIPMAP, array, mipmap_bytes(desc, levels), array,
                     desc, levels);
}

/* Unified memory migrates to any GPU and can exceed the device: it cannot be held to a
 * cap, so under a region it is refused, as cGPU does, saying so once. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    gs_enter_cuda();
    if (!gs_capping())
        return GS_CALL_CUDA(cuMemAllocManaged, dptr, bytesize, flags);
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gs_log(1, "cuMemAllocManaged refused: unified memory cannot be capped under gpushare "
                  "(CUDA_ERROR_NOT_SUPPORTED)");
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define FREE(name, kind, key, ...)                     \
    do {                                               \
        gs_enter_cuda();                               \
        CUresult rc = GS_CALL_CUDA(name, __VA_ARGS__); \
        release(kind, (uint64_t)(key), rc);            \
        return rc;                                     \
    } while (0)

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { FREE(cuMemFree, GS_POINTER, dptr, dptr); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE(cuMemFree_v2, GS_POINTER, dptr, dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync, GS_POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync_ptsz, GS_POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
    FREE(cuArrayDestroy, GS_ARRAY, (uintptr_t)array, array);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    FREE(cuMipmappedArrayDestroy, GS_MIPMAP, (uintptr_t)array, array);
}

