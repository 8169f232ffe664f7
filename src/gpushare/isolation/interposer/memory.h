/*
 * What the memory hooks share: the table of what this process holds (held.c), the
 * admission of a request against the cap and its settling after the driver (memory.c),
 * and what pools keep after their allocations are freed (pools.c). The hooks themselves
 * are in memory.c (plain allocations and their frees), vmm.c, pools.c, limits.c
 * (cuCtxSetLimit) and view.c (cuMemGetInfo).
 */
#ifndef GPUSHARE_MEMORY_H
#define GPUSHARE_MEMORY_H

#include <pthread.h>
#include <stdint.h>

#include "hooks.h"

/* What this process holds, by (kind, pointer or handle). Process-local: a pointer is
 * freed by the process that allocated it. */
enum gs_kind { GS_EMPTY, GS_POINTER, GS_HANDLE, GS_ARRAY, GS_MIPMAP, GS_MAPPING };

struct gs_held {
    uint64_t key;
    uint64_t bytes;    /* MAPPING: the length mapped */
    uint64_t link;     /* POINTER: the pool it came from (0: none); MAPPING: its handle */
    uint32_t handles;  /* HANDLE: unreleased handles of the physical allocation */
    uint32_t mappings; /* HANDLE: its mappings */
    uint8_t kind;
    int8_t gpu;
};

/* Guards the table, and the pools' books (pools.c). */
extern pthread_mutex_t gs_held_lock;

/* These three need gs_held_lock. gs_held_insert: 0 kept, -1 no memory to grow into;
 * pointers into the table are stale afterwards. */
struct gs_held *gs_held_find(enum gs_kind kind, uint64_t key);
int gs_held_insert(const struct gs_held *h);
void gs_held_erase(struct gs_held *h);

/* Keeps `kind` `key` holding `bytes` on `gpu` (takes the lock); what cannot be kept is
 * given back, better uncounted than never freed. */
void gs_remember(enum gs_kind kind, uint64_t key, int gpu, uint64_t bytes);

/* A process that fails closed takes the capped paths too, as far as gs_admit(), which
 * refuses: it has no region (gs_gpu_of_device answers -1). */
int gs_capping(void);

/* The region entry of the calling thread's device (-1: not capped here). */
CUresult gs_context_gpu(int *gpu);

/* Reserve before the driver (asking pools what they still keep first, when the cap
 * would refuse); CUDA_SUCCESS lets the call go on. */
CUresult gs_admit(int gpu, uint64_t bytes);

/* After the driver: keep the reservation with what it allocated, or give it back. */
CUresult gs_settle(CUresult rc, enum gs_kind kind, uint64_t key, int gpu, uint64_t bytes);

/* Pools (pools.c). A freed pool allocation goes back to its pool, still counted; what is
 * to be given back now (needs gs_held_lock). */
uint64_t gs_pool_returned_locked(uint64_t pool, uint64_t bytes);
/* What all pools keep beyond their live allocations, read without the lock. */
uint64_t gs_pools_keeping(void);
/* Asks the driver what the pools that keep memory still hold, and gives back the rest. */
void gs_pools_settle(void);

/* In a forked child: forget the parent's books. */
void gs_held_forked(void);
void gs_pools_forked(void);
void gs_limits_forked(void);

#endif
