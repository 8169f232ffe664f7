/*
 * Lazy initialisation, configuration from the environment, logging and the map from a
 * CUDA device or NVML handle to the container's GPU entry.
 *
 * The library is preloaded into every process of a container (bash included), so
 * nothing runs at load time: the environment is read and the real drivers resolved on
 * the first hooked call, once (pthread_once), and never again on the hot path.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"
#include "region.h"

#define CUDA_HOOK(name, params) name##_fn real_##name;
#define CUDA_REAL(name, params) name##_fn real_##name;
#define NVML_HOOK(name, params) name##_fn real_##name;
#define NVML_REAL(name, params) name##_fn real_##name;
#include "hooks.def"

const struct gs_symbol gs_symbols[] = {
#define CUDA_HOOK(name, params) {#name, (void *)name, (void **)&real_##name, GS_CUDA},
#define CUDA_REAL(name, params) {#name, NULL, (void **)&real_##name, GS_CUDA},
#define NVML_HOOK(name, params) {#name, (void *)name, (void **)&real_##name, GS_NVML},
#define NVML_REAL(name, params) {#name, NULL, (void **)&real_##name, GS_NVML},
#include "hooks.def"
};
const int gs_symbol_count = sizeof gs_symbols / sizeof gs_symbols[0];

struct gs_state gs = {0, 1};
static struct gs_config config;
static int ordinal_mapping; /* NVIDIA_VISIBLE_DEVICES gave no UUIDs: device i is entry i */
static int forked; /* set in a forked child until its first hooked call */

uint64_t gs_now_ns(void) {
    struct timespec t; /* vDSO: no system call */
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void gs_log(int level, const char *format, ...) {
    if (level > gs.log_level)
        return;
    char line[512];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    fprintf(stderr, "gpushare-cuda[%d]: %s\n", (int)getpid(), line);
}

/* "3" or "3,4": GiB per visible GPU; one value caps every GPU. */
static unsigned parse_caps(const char *text, uint64_t caps[GS_MAX_GPUS]) {
    unsigned n = 0;
    while (text && *text && n < GS_MAX_GPUS) {
        char *end;
        unsigned long long gib = strtoull(text, &end, 10);
        if (end == text)
            break;
        caps[n++] = (uint64_t)gib << 30;
        text = *end == ',' ? end + 1 : end;
    }
    return n;
}

/* The UUIDs of NVIDIA_VISIBLE_DEVICES; 0 when it is absent, "all", "none" or indices. */
static unsigned parse_uuids(const char *text, char uuids[GS_MAX_GPUS][GS_UUID_BYTES]) {
    unsigned n = 0;
    while (text && *text && n < GS_MAX_GPUS) {
        size_t length = strcspn(text, ",");
        if (strncmp(text, "GPU-", 4) != 0 && strncmp(text, "MIG-", 4) != 0)
            return 0;
        if (length < GS_UUID_BYTES) {
            memcpy(uuids[n], text, length);
            uuids[n][length] = '\0';
            n++;
        }
        text += length + (text[length] == ',');
    }
    return n;
}

static void read_config(void) {
    const char *level = getenv("GPUSHARE_CUDA_LOG");
    if (level && *level)
        gs.log_level = atoi(level);
    uint64_t caps[GS_MAX_GPUS] = {0};
    unsigned cap_count = parse_caps(getenv("ALIYUN_COM_GPU_MEM_CONTAINER"), caps);
    unsigned uuid_count = parse_uuids(getenv("NVIDIA_VISIBLE_DEVICES"), config.uuid);
    ordinal_mapping = uuid_count == 0;
    /* Without UUIDs the count of devices is unknown until the driver says: one cap value
     * then covers every ordinal. */
    config.gpu_count = uuid_count ? uuid_count : (cap_count == 1 ? GS_MAX_GPUS : cap_count);
    for (unsigned i = 0; i < config.gpu_count; i++)
        config.cap_bytes[i] = cap_count == 1 ? caps[0] : (i < cap_count ? caps[i] : 0);
}

static void on_fork_child(void) {
    __atomic_store_n(&forked, 1, __ATOMIC_RELEASE);
    if (gs.active) {
        gs_region_forked();
        gs_memory_forked();
    }
}

static void initialise(void) {
    gs_resolve_dlsym();
    read_config();
    const char *path = getenv("GPUSHARE_CUDA_REGION");
    if (path == NULL || *path == '\0') {
        gs_log(3, "GPUSHARE_CUDA_REGION unset: passing every call through");
        return;
    }
    if (gs_region_open(path, &config) != 0 || gs_region_attach() != 0)
        return;
    gs.active = 1;
    pthread_atfork(NULL, NULL, on_fork_child);
    gs_log(2, "region %s: %u GPUs, %s mapping", path, gs_region->gpu_count,
           ordinal_mapping ? "ordinal" : "UUID");
}

static void resolve(enum gs_family family, const char *library) {
    gs_resolve_dlsym();
    void *handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        gs_log(1, "cannot load %s: %s", library, dlerror());
        return;
    }
    for (int i = 0; i < gs_symbol_count; i++)
        if (gs_symbols[i].family == family)
            *gs_symbols[i].real = gs_real_dlsym(handle, gs_symbols[i].name);
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static void resolve_cuda(void) { resolve(GS_CUDA, "libcuda.so.1"); }
static void resolve_nvml(void) { resolve(GS_NVML, "libnvidia-ml.so.1"); }

static void enter(void) {
    pthread_once(&config_once, initialise);
    /* One thread of a forked child takes its slot, however many race here. */
    if (UNLIKELY(forked) && __atomic_exchange_n(&forked, 0, __ATOMIC_ACQ_REL)) {
        if (gs.active && gs_region_attach() != 0)
            gs.active = 0;
    }
}

void gs_enter_cuda(void) {
    pthread_once(&cuda_once, resolve_cuda);
    enter();
}

void gs_enter_nvml(void) {
    pthread_once(&nvml_once, resolve_nvml);
    enter();
}

/* Normal exit gives the slot back at once; after a kill the reaper does. */
__attribute__((destructor)) static void finish(void) {
    if (gs.active)
        gs_region_detach();
}

static int uuid_entry(const char *uuid) {
    for (unsigned i = 0; i < gs_region->gpu_count && i < GS_MAX_GPUS; i++)
        if (strcasecmp(gs_region->gpus[i].uuid, uuid) == 0)
            return (int)i;
    gs_log(1, "GPU %s is not among the container's: not capping it", uuid);
    return -1;
}

static int ordinal_entry(int ordinal) {
    return ordinal >= 0 && (unsigned)ordinal < gs_region->gpu_count ? ordinal : -1;
}

static int by_uuid(void) { return gs_region->gpus[0].uuid[0] != '\0'; }

#define MAX_DEVICES 64
static int device_entry[MAX_DEVICES]; /* entry + 2; 0: not asked yet */

int gs_gpu_of_device(CUdevice device) {
    if (device < 0 || device >= MAX_DEVICES)
        return -1;
    int cached = __atomic_load_n(&device_entry[device], __ATOMIC_RELAXED);
    if (cached)
        return cached - 2;
    int entry = ordinal_entry(device);
    if (by_uuid()) {
        CUuuid id;
        CUresult rc = real_cuDeviceGetUuid_v2 ? real_cuDeviceGetUuid_v2(&id, device)
                      : real_cuDeviceGetUuid ? real_cuDeviceGetUuid(&id, device)
                                             : CUDA_ERROR_NOT_FOUND;
        if (rc != CUDA_SUCCESS)
            return -1; /* not cached: the driver may answer later */
        const unsigned char *b = (const unsigned char *)id.bytes;
        char text[48];
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                 b[12], b[13], b[14], b[15]);
        entry = uuid_entry(text);
    }
    __atomic_store_n(&device_entry[device], entry + 2, __ATOMIC_RELAXED);
    return entry;
}

int gs_gpu_of_nvml(nvmlDevice_t device) {
    if (by_uuid()) {
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (!real_nvmlDeviceGetUUID || real_nvmlDeviceGetUUID(device, uuid, sizeof uuid))
            return -1;
        return uuid_entry(uuid);
    }
    unsigned count = 0;
    if (!real_nvmlDeviceGetCount_v2 || !real_nvmlDeviceGetHandleByIndex_v2 ||
        real_nvmlDeviceGetCount_v2(&count))
        return -1;
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t handle;
        if (real_nvmlDeviceGetHandleByIndex_v2(i, &handle) == NVML_SUCCESS && handle == device)
            return ordinal_entry((int)i);
    }
    return -1;
}

CUresult gs_current_device(CUdevice *device) {
    return real_cuCtxGetDevice ? real_cuCtxGetDevice(device) : CUDA_ERROR_NOT_INITIALIZED;
}
