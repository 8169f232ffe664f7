/*
 * The region: one file per container, mmap'd MAP_SHARED by every process of it that
 * uses CUDA, and read/written by the node's isolation agent. The agent's ctypes view is
 * built from this file (layout.py parses the structs and #defines below): keep to the
 * forms it reads, and it follows any edit.
 *
 * Memory accounting is exact across processes: a process-shared robust mutex guards
 * the check of a request against the cap together with its reservation, and is held
 * for nothing else (never across a driver call). Each process owns one slot; it holds
 * an OFD lock on the slot's first byte for as long as it lives, so a reaper (another
 * process of the container, in any pid namespace) tells a dead owner by F_OFD_GETLK
 * finding the byte unlocked, and gives its bytes back: when a request would not fit, and
 * when a memory view is asked (gs_share_of). The agent only reads who is alive.
 *
 * Compute: the agent writes each GPU's gate (1 open, 0 hold) and share target; the
 * library counts launches, held launches and the time they were held, and the
 * allocations it refused at the cap. The agent turns those counts into metrics.
 */
#ifndef GPUSHARE_REGION_H
#define GPUSHARE_REGION_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define GS_REGION_MAGIC 0x31524853555047ULL /* "GPUSHR1" little-endian */
#define GS_LAYOUT_VERSION 2u /* 2: gs_gpu.allocations_refused */
#define GS_MAX_GPUS 16
#define GS_MAX_SLOTS 1024
#define GS_UUID_BYTES 64
#define GS_MAX_CAP_BYTES (1ull << 50) /* a cap is 1 byte .. 1 PiB */

struct gs_gpu {
    char uuid[GS_UUID_BYTES]; /* "GPU-..." from NVIDIA_VISIBLE_DEVICES; "" maps by ordinal */
    uint64_t cap_bytes;       /* 0: no cap */
    uint64_t used_bytes;      /* the sum of the slots' used[] for this GPU */
    uint32_t gate;            /* agent: 1 launches go, 0 they wait */
    uint32_t share_percent;   /* agent: the compute share it aims at (informational) */
    uint64_t launches;        /* library: launches made on this GPU */
    uint64_t launches_held;   /* library: of those, how many waited at a closed gate */
    uint64_t held_ns;         /* library: the time they waited, summed */
    uint64_t last_launch_ns;  /* library: CLOCK_MONOTONIC of the latest launch */
    uint64_t gate_until_ns;   /* agent: a closed gate holds until then (CLOCK_MONOTONIC), so
                                 launches flow again when the agent stops writing it */
    uint64_t allocations_refused; /* library: allocations refused at the cap (under the lock) */
} __attribute__((aligned(64)));

struct gs_slot {
    int32_t pid;        /* in the owner's pid namespace; 0: free */
    uint32_t reserved;
    uint64_t attached_ns; /* CLOCK_MONOTONIC when taken */
    uint64_t used[GS_MAX_GPUS];
} __attribute__((aligned(64)));

struct gs_region {
    uint64_t magic; /* written last, with release semantics, by the creator */
    uint32_t layout_version;
    uint32_t gpu_count;
    uint32_t slot_count;
    uint32_t attached; /* processes holding a slot now */
    uint64_t created_ns;
    uint64_t heartbeat_ns; /* CLOCK_MONOTONIC of the latest attach, allocation or launch */
    union {
        pthread_mutex_t mutex; /* process-shared, robust */
        char mutex_space[64];
    } lock;
    struct gs_gpu gpus[GS_MAX_GPUS];
    struct gs_slot slots[GS_MAX_SLOTS];
};

struct gs_config {
    unsigned gpu_count;
    char uuid[GS_MAX_GPUS][GS_UUID_BYTES];
    uint64_t cap_bytes[GS_MAX_GPUS];
};

extern struct gs_region *gs_region;

/* Maps (creating if first) the region at `path`; 0 on success, else the process fails
 * closed (gs_refuse). `granted`: config is the node's grant, so it is what is enforced
 * and an existing region must be for its GPUs; else the region's own caps are. */
int gs_region_open(const char *path, const struct gs_config *config, int granted);
/* The cap this process enforces on GPU `gpu`, held in its own memory (a process of the
 * container can rewrite the region's cap_bytes). */
uint64_t gs_cap(int gpu);
/* Takes a slot for this process (again after fork); 0 on success. */
int gs_region_attach(void);
/* Gives this process's slot back, with what it still holds. */
void gs_region_detach(void);
/* Reserves `bytes` on GPU `gpu` for this process if its cap allows (after reaping dead
 * processes once when it does not); 1 reserved, 0 refused. */
int gs_reserve(int gpu, uint64_t bytes);
void gs_unreserve(int gpu, uint64_t bytes);
/* After fork: the child's next hooked call takes a slot of its own. */
void gs_region_forked(void);

/* What the memory views (cuMemGetInfo, NVML) show of GPU `gpu` on a device of `physical`
 * bytes: total = min(cap, physical), used = what the container's processes hold. */
struct gs_share {
    uint64_t total;
    uint64_t used;
};
/* Reaps first, at most once a GS_REAP_EVERY_NS per process, when a slot holding memory
 * has lost its owner (killed, _exit without destructors, exec), so a view shows a dead
 * process's bytes back within that time rather than at the next refused allocation. */
#define GS_REAP_EVERY_NS 100000000ull
struct gs_share gs_share_of(int gpu, uint64_t physical);

#endif
