/*
 * VMM: cuMemCreate's physical allocation stays counted while an unreleased handle or a
 * mapping refers to it, as the driver keeps it: create -> map -> release (the usual
 * order) leaves it counted until the unmap.
 */
#include "memory.h"
#include "region.h"

/* cuMemCreate names its location: only device memory is capped; host and NUMA
 * locations pass through untouched (nothing to index with their id). */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    gs_enter_cuda();
    if (!gs_capping() || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return GS_CALL_CUDA(cuMemCreate, handle, size, prop, flags);
    int gpu = gs_gpu_of_device(prop->location.id);
    CUresult rc = gs_admit(gpu, size);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = GS_CALL_CUDA(cuMemCreate, handle, size, prop, flags);
    return gs_settle(rc, GS_HANDLE, rc == CUDA_SUCCESS ? *handle : 0, gpu, size);
}

static void drop_if_unreferenced_locked(struct gs_held *h, uint64_t back[GS_MAX_GPUS]) {
    if (h->handles == 0 && h->mappings == 0) {
        back[h->gpu] += h->bytes;
        gs_held_erase(h);
    }
}

static void give_back(const uint64_t back[GS_MAX_GPUS]) {
    for (int gpu = 0; gpu < GS_MAX_GPUS; gpu++)
        if (back[gpu])
            gs_unreserve(gpu, back[gpu]);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemRelease, handle);
    if (rc != CUDA_SUCCESS || !gs_capping())
        return rc;
    uint64_t back[GS_MAX_GPUS] = {0};
    pthread_mutex_lock(&gs_held_lock);
    struct gs_held *h = gs_held_find(GS_HANDLE, handle);
    if (h != NULL && h->handles > 0) {
        h->handles--;
        drop_if_unreferenced_locked(h, back);
    }
    pthread_mutex_unlock(&gs_held_lock);
    give_back(back);
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemMap, ptr, size, offset, handle, flags);
    if (rc != CUDA_SUCCESS || !gs_capping())
        return rc;
    pthread_mutex_lock(&gs_held_lock);
    struct gs_held *h = gs_held_find(GS_HANDLE, handle);
    if (h != NULL) {
        h->mappings++;
        struct gs_held mapping = {ptr, size, handle, 0, 0, GS_MAPPING, h->gpu};
        if (gs_held_insert(&mapping) != 0)
            gs_held_find(GS_HANDLE, handle)->mappings--; /* untracked: its unmap finds nothing */
    }
    pthread_mutex_unlock(&gs_held_lock);
    return rc;
}

/* The driver unmaps whole mappings only, so [ptr, ptr + size) is a run of them. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemUnmap, ptr, size);
    if (rc != CUDA_SUCCESS || !gs_capping())
        return rc;
    uint64_t back[GS_MAX_GPUS] = {0};
    pthread_mutex_lock(&gs_held_lock);
    struct gs_held *mapping;
    for (uint64_t at = ptr; at < ptr + size && (mapping = gs_held_find(GS_MAPPING, at));) {
        uint64_t handle = mapping->link, length = mapping->bytes;
        gs_held_erase(mapping);
        struct gs_held *h = gs_held_find(GS_HANDLE, handle);
        if (h != NULL && h->mappings > 0) {
            h->mappings--;
            drop_if_unreferenced_locked(h, back);
        }
        if (length == 0)
            break;
        at += length;
    }
    pthread_mutex_unlock(&gs_held_lock);
    give_back(back);
    return rc;
}

/* The driver hands out the handle the memory was mapped with, one more to release. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemRetainAllocationHandle, handle, addr);
    if (rc != CUDA_SUCCESS || !gs_capping() || handle == NULL)
        return rc;
    pthread_mutex_lock(&gs_held_lock);
    struct gs_held *h = gs_held_find(GS_HANDLE, *handle);
    if (h != NULL)
        h->handles++;
    pthread_mutex_unlock(&gs_held_lock);
    return rc;
}

