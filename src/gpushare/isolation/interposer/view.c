/*
 * The container's view of memory: cuMemGetInfo answers with its share of the GPU
 * (gs_share_of), and free never more than the device has free.
 */
#include "memory.h"
#include "region.h"

static CUresult memory_view(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t free_now, total_now;
    CUresult rc = GS_CALL_CUDA(cuMemGetInfo_v2, &free_now, &total_now);
    if (rc != CUDA_SUCCESS)
        return rc;
    *free_bytes = free_now, *total_bytes = total_now;
    int gpu;
    if (!gs_capping() || gs_context_gpu(&gpu) != CUDA_SUCCESS || gpu < 0)
        return CUDA_SUCCESS;
    struct gs_share share = gs_share_of(gpu, total_now);
    uint64_t left = share.total > share.used ? share.total - share.used : 0;
    *total_bytes = share.total;
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
    if (!gs_capping())
        return GS_CALL_CUDA(cuMemGetInfo, free_bytes, total_bytes);
    uint64_t f, t;
    CUresult rc = memory_view(&f, &t);
    if (rc == CUDA_SUCCESS) { /* the 32-bit form saturates, as the driver's does */
        *free_bytes = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
        *total_bytes = t > 0xffffffffull ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}
