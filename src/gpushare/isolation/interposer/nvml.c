/*
 * NVML's memory view of a capped GPU, so nvidia-smi and frameworks that size themselves
 * from NVML see the container's share (gs_share_of): total = min(cap, physical), used =
 * what the container holds, free = total - used, never below zero. The _v2 form also
 * says what the driver reserves, and its numbers add up as the driver's do:
 * total = reserved + used + free, with reserved = min(the driver's, total) and used
 * clamped to what is left of total after it.
 */
#include "hooks.h"
#include "region.h"

/* The container's share of `device`, a GPU of `physical` bytes; 0: not capped here. */
static int share_of(nvmlDevice_t device, uint64_t physical, struct gs_share *share) {
    if (!gs.active)
        return 0;
    int gpu = gs_gpu_of_nvml(device);
    if (gpu < 0)
        return 0;
    *share = gs_share_of(gpu, physical);
    return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    gs_enter_nvml();
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = GS_CALL_NVML(nvmlDeviceGetMemoryInfo, device, memory);
    struct gs_share share;
    if (rc == NVML_SUCCESS && share_of(device, memory->total, &share)) {
        memory->total = share.total;
        memory->used = share.used;
        memory->free = share.total > share.used ? share.total - share.used : 0;
    }
    return rc;
}

/* A driver without the _v2 form still answers through the first one (nothing reserved). */
static nvmlReturn_t driver_memory_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (real_nvmlDeviceGetMemoryInfo_v2)
        return real_nvmlDeviceGetMemoryInfo_v2(device, memory);
    nvmlMemory_t v1;
    nvmlReturn_t rc = GS_CALL_NVML(nvmlDeviceGetMemoryInfo, device, &v1);
    if (rc == NVML_SUCCESS) {
        memory->total = v1.total, memory->free = v1.free, memory->used = v1.used;
        memory->reserved = 0;
    }
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    gs_enter_nvml();
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = driver_memory_v2(device, memory);
    struct gs_share share;
    if (rc == NVML_SUCCESS && share_of(device, memory->total, &share)) {
        uint64_t reserved = memory->reserved < share.total ? memory->reserved : share.total;
        uint64_t room = share.total - reserved;
        uint64_t used = share.used < room ? share.used : room;
        memory->total = share.total;
        memory->reserved = reserved;
        memory->used = used;
        memory->free = room - used;
    }
    return rc;
}
