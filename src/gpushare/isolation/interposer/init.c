/*
 * Lazy initialisation, configuration (the node's grant, else the environment), logging
 * and the map from a CUDA device or NVML handle to the container's GPU entry.
 *
 * The library is preloaded into every process of a container (bash included), so
 * nothing runs at load time: the configuration is read and the real drivers resolved on
 * the first hooked call, once (pthread_once), and never again on the hot path.
 *
 * It fails closed: a grant, cap or region it cannot trust, or no free slot, refuses
 * every allocation of the process (gs.refusing) rather than let it through uncapped.
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

#include "grant.h"
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

struct gs_state gs = {0, 1, NULL};
/* The container's GPUs and caps: the grant's, or the environment's until the region is
 * open, then the region's. The device map reads only this copy, never the region. */
static struct gs_config config;
static int forked; /* set in a forked child until its first hooked call */
static char refusal[400];

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

void gs_refuse(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(refusal, sizeof refusal, format, args);
    va_end(args);
    gs.active = 0;
    gs.refusing = refusal;
    gs_log(1, "refusing every allocation: %s", refusal);
}

/* "3" or "3,4": whole GiB per visible GPU, 1 .. 2^20 (GS_MAX_CAP_BYTES); one value caps
 * every GPU. The count, or -1 if any value is not one. */
static int parse_caps(const char *text, uint64_t caps[GS_MAX_GPUS]) {
    int n = text ? gs_parse_numbers(text, strlen(text), 1, GS_MAX_CAP_BYTES >> 30, caps) : -1;
    for (int i = 0; i < n; i++)
        caps[i] <<= 30;
    return n;
}

/* The UUIDs of NVIDIA_VISIBLE_DEVICES; 0 when it is absent, "all", "none" or indices. */
static unsigned parse_uuids(const char *text, char uuids[GS_MAX_GPUS][GS_UUID_BYTES]) {
    int n = text && *text ? gs_parse_uuids(text, strlen(text), uuids) : -1;
    return n > 0 ? (unsigned)n : 0;
}

/* No grant: the caps from the environment, as the device plugin set them; 0 or fails
 * closed (a missing or bad value must not mean "no cap"). */
static int read_environment(void) {
    const char *text = getenv("ALIYUN_COM_GPU_MEM_CONTAINER");
    uint64_t caps[GS_MAX_GPUS];
    int cap_count = parse_caps(text, caps);
    unsigned uuid_count = parse_uuids(getenv("NVIDIA_VISIBLE_DEVICES"), config.uuid);
    if (cap_count < 1) {
        gs_refuse("ALIYUN_COM_GPU_MEM_CONTAINER=%.40s is not 1 to %d caps of 1..%llu whole GiB",
                  text ? text : "(unset)", GS_MAX_GPUS, GS_MAX_CAP_BYTES >> 30);
        return -1;
    }
    if (uuid_count && cap_count != 1 && (unsigned)cap_count != uuid_count) {
        gs_refuse("ALIYUN_COM_GPU_MEM_CONTAINER=%.40s gives %d caps for %u visible GPUs", text,
                  cap_count, uuid_count);
        return -1;
    }
    /* Without UUIDs the count of devices is unknown until the driver says: one cap value
     * then covers every ordinal. */
    config.gpu_count = uuid_count                ? uuid_count
                       : cap_count == 1 ? GS_MAX_GPUS
                                        : (unsigned)cap_count;
    for (unsigned i = 0; i < config.gpu_count; i++)
        config.cap_bytes[i] = caps[cap_count == 1 ? 0 : i];
    return 0;
}

/* Without a grant the region's GPUs are the container's: its first process chose them. */
static void adopt_region_gpus(void) {
    config.gpu_count = gs_region->gpu_count;
    for (unsigned i = 0; i < config.gpu_count; i++)
        memcpy(config.uuid[i], gs_region->gpus[i].uuid, GS_UUID_BYTES);
}

static int by_uuid(void) { return config.uuid[0][0] != '\0'; }

/* The region's path: the grant's, else GPUSHARE_CUDA_REGION's; NULL when this is not a
 * gpushare container or the process fails closed. Sets config and *granted. */
static const char *read_config(int *granted) {
    static struct gs_grant grant; /* once, under pthread_once */
    char why[256];
    switch (gs_grant_read(&grant, why, sizeof why)) {
    case GS_GRANT_OK:
        config = grant.config;
        *granted = 1;
        return grant.region;
    case GS_GRANT_BAD:
        gs_refuse("grant %s: %s", GS_GRANT_PATH, why);
        return NULL;
    case GS_GRANT_ABSENT:
        break;
    }
    *granted = 0;
    const char *path = getenv("GPUSHARE_CUDA_REGION");
    if (path == NULL || *path == '\0') {
        gs_log(3, "no grant and GPUSHARE_CUDA_REGION unset: passing every call through");
        return NULL;
    }
    return read_environment() == 0 ? path : NULL;
}

static void on_fork_child(void) {
    __atomic_store_n(&forked, 1, __ATOMIC_RELEASE);
    if (gs.active) {
        gs_region_forked();
        gs_memory_forked();
        gs_launches_forked();
    }
}

static void initialise(void) {
    gs_resolve_dlsym();
    const char *level = getenv("GPUSHARE_CUDA_LOG");
    uint64_t chosen[GS_MAX_GPUS];
    if (level && gs_parse_numbers(level, strlen(level), 0, 9, chosen) == 1)
        gs.log_level = (int)chosen[0];
    int granted;
    const char *path = read_config(&granted);
    if (path == NULL || gs_region_open(path, &config, granted) != 0 || gs_region_attach() != 0)
        return;
    if (!granted)
        adopt_region_gpus();
    gs.active = 1;
    pthread_atfork(NULL, NULL, on_fork_child);
    gs_log(2, "region %s: %u GPUs, %s mapping, caps from the %s", path, config.gpu_count,
           by_uuid() ? "UUID" : "ordinal", granted ? "grant" : "environment");
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
    /* One thread of a forked child takes its slot, however many race here (without one
     * it fails closed). */
    if (UNLIKELY(forked) && __atomic_exchange_n(&forked, 0, __ATOMIC_ACQ_REL) && gs.active)
        gs_region_attach();
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
    if (gs.active) {
        gs_launches_flush();
        gs_region_detach();
    }
}

static int uuid_entry(const char *uuid) {
    for (unsigned i = 0; i < config.gpu_count; i++)
        if (strcasecmp(config.uuid[i], uuid) == 0)
            return (int)i;
    return -1;
}

static int ordinal_entry(int ordinal) {
    return ordinal >= 0 && (unsigned)ordinal < config.gpu_count ? ordinal : -1;
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
    if (by_uuid()) {
        CUuuid id;
        CUresult rc = real_cuDeviceGetUuid_v2 ? real_cuDeviceGetUuid_v2(&id, device)
                      : real_cuDeviceGetUuid ? real_cuDeviceGetUuid(&id, device)
                                             : CUDA_ERROR_NOT_FOUND;
        if (rc != CUDA_SUCCESS)
            return -1; /* not cached: the driver may answer later */
        const unsigned char *b = (const unsigned char *)id.bytes;
        snprintf(text, sizeof text,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                 b[12], b[13], b[14], b[15]);
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
