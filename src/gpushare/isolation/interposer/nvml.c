/*
 * NVML's memory view of a capped GPU, so nvidia-smi and frameworks that size themselves
 * from NVML see the container's share: total = min(cap, physical), used = what the
 * container holds, free = total - used, never below zero.
 */
#include "hooks.h"
#include "region.h"

static void view(nvmlDevice_t device, unsigned long long *total, unsigned long long *free,
                 unsigned long long *used) {
    if (!gs.active)
        return;
    int gpu = gs_gpu_of_nvml(device);
    if (gpu < 0)
        return;
    const struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t cap = gs_cap(gpu); /* what this process enforces, not the region's word */
    uint64_t mine = __atomic_load_n(&g->used_bytes, __ATOMIC_RELAXED);
    if (cap && cap < *total)
        *total = cap;
    *used = mine;
    *free = *total > mine ? *total - mine : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    gs_enter_nvml();
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (real_nvmlDeviceGetMemoryInfo == NULL)
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = real_nvmlDeviceGetMemoryInfo(device, memory);
    if (rc == NVML_SUCCESS)
        view(device, &memory->total, &memory->free, &memory->used);
    return rc;
}

/* A driver without the _v2 form still answers through the first one. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    gs_enter_nvml();
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc;
    if (real_nvmlDeviceGetMemoryInfo_v2) {
        rc = real_nvmlDeviceGetMemoryInfo_v2(device, memory);
    } else if (real_nvmlDeviceGetMemoryInfo) {
        nvmlMemory_t v1;
        rc = real_nvmlDeviceGetMemoryInfo(device, &v1);
        memory->total = v1.total, memory->free = v1.free, memory->used = v1.used;
        memory->reserved = 0;
    } else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    }
    if (rc == NVML_SUCCESS)
        view(device, &memory->total, &memory->free, &memory->used);
    return rc;
}
