/*
 * The map from a CUDA device or an NVML handle to the container's GPU entry: by UUID when
 * the container's GPUs are named (NVIDIA_VISIBLE_DEVICES or the grant), else by ordinal.
 * It reads only its own copy of the container's GPUs, never the region (which the
 * container can write), and caches each CUDA device's answer.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hooks.h"
#include "region.h"

static unsigned gpu_count;
static char uuids[GS_MAX_GPUS][GS_UUID_BYTES];

void gs_devices_map(const struct gs_config *config) {
    gpu_count = config->gpu_count;
    memcpy(uuids, config->uuid, sizeof uuids);
}

int gs_devices_by_uuid(void) { return uuids[0][0] != '\0'; }

static int uuid_entry(const char *uuid) {
    for (unsigned i = 0; i < gpu_count; i++)
        if (strcasecmp(uuids[i], uuid) == 0)
            return (int)i;
    return -1;
}

static int ordinal_entry(int ordinal) {
    return ordinal >= 0 && (unsigned)ordinal < gpu_count ? ordinal : -1;
}

/* The driver's UUID of `device` as NVIDIA_VISIBLE_DEVICES spells it; CUDA_SUCCESS or
 * what the driver said. */
static CUresult device_uuid(CUdevice device, char text[48]) {
    CUuuid id;
    CUresult rc = real_cuDeviceGetUuid_v2 ? real_cuDeviceGetUuid_v2(&id, device)
                                          : GS_CALL_CUDA(cuDeviceGetUuid, &id, device);
    if (rc != CUDA_SUCCESS)
        return rc;
    const unsigned char *b = (const unsigned char *)id.bytes;
    snprintf(text, 48,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return CUDA_SUCCESS;
}

#define MAX_DEVICES 64
static int device_entry[MAX_DEVICES]; /* entry + 2; 0: not asked yet */

int gs_gpu_of_device(CUdevice device) {
    if (!gs.active || device < 0 || device >= MAX_DEVICES)
        return -1;
    int cached = __atomic_load_n(&device_entry[device], __ATOMIC_RELAXED);
    if (cached)
        return cached - 2;
    int entry = ordinal_entry(device);
    char text[48] = "";
    if (gs_devices_by_uuid()) {
        if (device_uuid(device, text) != CUDA_SUCCESS)
            return -1; /* not cached: the driver may answer later */
        entry = uuid_entry(text);
    }
    int unasked = 0; /* the thread that caches it says so, once per device */
    if (__atomic_compare_exchange_n(&device_entry[device], &unasked, entry + 2, 0,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED) && entry < 0)
        gs_log(1, "device %d%s%s is not among the container's GPUs: refusing allocations on it",
               device, *text ? " " : "", text);
    return entry;
}

int gs_gpu_of_nvml(nvmlDevice_t device) {
    if (gs_devices_by_uuid()) {
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (GS_CALL_NVML(nvmlDeviceGetUUID, device, uuid, sizeof uuid) != NVML_SUCCESS)
            return -1;
        return uuid_entry(uuid);
    }
    unsigned count = 0;
    if (GS_CALL_NVML(nvmlDeviceGetCount_v2, &count) != NVML_SUCCESS)
        return -1;
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t handle;
        if (GS_CALL_NVML(nvmlDeviceGetHandleByIndex_v2, i, &handle) == NVML_SUCCESS &&
            handle == device)
            return ordinal_entry((int)i);
    }
    return -1;
}

CUresult gs_current_device(CUdevice *device) { return GS_CALL_CUDA(cuCtxGetDevice, device); }
