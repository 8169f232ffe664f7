/*
 * Lazy initialisation and configuration: the node's grant, else the environment the
 * device plugin set, decides the container's GPUs, their caps and the region's path.
 *
 * The library is preloaded into every process of a container (bash included), so
 * nothing runs at load time: the configuration is read and the real drivers resolved on
 * the first hooked call, once (pthread_once), and never again on the hot path.
 *
 * It fails closed: a grant, cap or region it cannot trust, or no free slot, refuses
 * every allocation of the process (gs.refusing) rather than let it through uncapped.
 */
#include <stdlib.h>
#include <string.h>

#include "grant.h"
#include "hooks.h"
#include "region.h"

/* The variables' names are gpushare.environment's, handed over by build.py. */
#if !defined(GS_ENV_MEM_CONTAINER) || !defined(GS_ENV_VISIBLE_DEVICES) || \
    !defined(GS_ENV_REGION) || !defined(GS_ENV_LOG)
#error "build with build.defines(): the environment's names come from gpushare.environment"
#endif

struct gs_state gs = {0, 1, NULL};
/* The container's GPUs and caps: the grant's, or the environment's until the region is
 * open, then the region's. */
static struct gs_config config;
static int forked; /* set in a forked child until its first hooked call */

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
    const char *text = getenv(GS_ENV_MEM_CONTAINER);
    uint64_t caps[GS_MAX_GPUS];
    int cap_count = parse_caps(text, caps);
    unsigned uuid_count = parse_uuids(getenv(GS_ENV_VISIBLE_DEVICES), config.uuid);
    if (cap_count < 1) {
        gs_refuse(GS_ENV_MEM_CONTAINER "=%.40s is not 1 to %d caps of 1..%llu whole GiB",
                  text ? text : "(unset)", GS_MAX_GPUS, GS_MAX_CAP_BYTES >> 30);
        return -1;
    }
    if (uuid_count && cap_count != 1 && (unsigned)cap_count != uuid_count) {
        gs_refuse(GS_ENV_MEM_CONTAINER "=%.40s gives %d caps for %u visible GPUs", text,
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

/* The region's path: the grant's, else the environment's; NULL when this is not a
 * gpushare container or the process fails closed. Sets config and *granted. */
static const char *read_config(int *granted) {
    static struct gs_grant grant; /* once, under pthread_once */
    char why[256];
    switch (gs_grant_read(&grant, why, sizeof why)) {
    case GS_GRANT_OK:
        config = grant.config;
        *granted = 1;
        gs_refusals_beside(grant.region);
        return grant.region;
    case GS_GRANT_BAD:
        gs_refuse("grant %s: %s", GS_GRANT_PATH, why);
        return NULL;
    case GS_GRANT_ABSENT:
        break;
    }
    *granted = 0;
    const char *path = getenv(GS_ENV_REGION);
    if (path == NULL || *path == '\0') {
        gs_log(3, "no grant and " GS_ENV_REGION " unset: passing every call through");
        return NULL;
    }
    gs_refusals_beside(path);
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
    const char *level = getenv(GS_ENV_LOG);
    uint64_t chosen[GS_MAX_GPUS];
    if (level && gs_parse_numbers(level, strlen(level), 0, 9, chosen) == 1)
        gs.log_level = (int)chosen[0];
    int granted;
    const char *path = read_config(&granted);
    if (path == NULL || gs_region_open(path, &config, granted) != 0 || gs_region_attach() != 0)
        return;
    if (!granted)
        adopt_region_gpus();
    gs_devices_map(&config);
    gs.active = 1;
    pthread_atfork(NULL, NULL, on_fork_child);
    gs_log(2, "region %s: %u GPUs, %s mapping, caps from the %s", path, config.gpu_count,
           gs_devices_by_uuid() ? "UUID" : "ordinal", granted ? "grant" : "environment");
}

static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void enter(void) {
    pthread_once(&config_once, initialise);
    /* One thread of a forked child takes its slot, however many race here (without one
     * it fails closed). */
    if (UNLIKELY(forked) && __atomic_exchange_n(&forked, 0, __ATOMIC_ACQ_REL) && gs.active)
        gs_region_attach();
}

void gs_enter_cuda(void) {
    gs_resolve(GS_CUDA);
    enter();
}

void gs_enter_nvml(void) {
    gs_resolve(GS_NVML);
    enter();
}

/* Normal exit gives the slot back at once; after a kill the reaper does. */
__attribute__((destructor)) static void finish(void) {
    if (gs.active) {
        gs_launches_flush();
        gs_region_detach();
    }
}
