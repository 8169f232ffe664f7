/*
 * Pools: cuMemAllocAsync and cuMemAllocFromPoolAsync take from a pool, and the pool keeps
 * what their frees leave behind until the driver gives it back (a trim, a synchronize
 * down to the release threshold, the pool's destruction). What a pool keeps stays
 * counted until then; an allocation that reuses it is not charged twice.
 */
#include <stdlib.h>

#include "memory.h"
#include "region.h"

/* Pools: what each has been charged (its live allocations and the memory it keeps after
 * their frees) and how much of that its live allocations hold. The rest, kept, stays
 * counted until the driver says the pool gave it back: its reserved size, asked after a
 * cuMemPoolTrimTo, a synchronize, or an allocation the kept bytes would refuse. */
#define HOST_POOL (-2) /* a pool of host memory: not capped */
struct pool_books {
    uint64_t pool;
    int gpu; /* the region's GPU, HOST_POOL, or -1: not the container's (refused) */
    int destroyed;
    uint64_t counted;
    uint64_t allocated; /* with what allocations in flight took of the kept bytes */
};
static struct pool_books *pools;
static int pool_count, pool_space;
static uint64_t kept_total; /* over all pools; read without the lock on the sync path */

static struct pool_books *pool_find(uint64_t pool) {
    for (int i = 0; i < pool_count; i++)
        if (pools[i].pool == pool)
            return &pools[i];
    return NULL;
}

static struct pool_books *pool_add(uint64_t pool, int gpu) {
    struct pool_books *p = pool_find(pool);
    if (p != NULL && !(p->destroyed && p->allocated == 0))
        return p;
    if (p == NULL) {
        if (pool_count == pool_space) {
            int space = pool_space ? 2 * pool_space : 16;
            struct pool_books *grown = realloc(pools, (size_t)space * sizeof *grown);
            if (grown == NULL)
                return NULL;
            pools = grown, pool_space = space;
        }
        p = &pools[pool_count++];
    }
    *p = (struct pool_books){pool, gpu, 0, 0, 0};
    return p;
}

static void pool_drop_if_done(struct pool_books *p) {
    if (p->destroyed && p->allocated == 0)
        *p = pools[--pool_count];
}

static void kept_add(int64_t delta) {
    __atomic_store_n(&kept_total, kept_total + (uint64_t)delta, __ATOMIC_RELAXED);
}

void gs_pools_forked(void) {
    free(pools);
    pools = NULL, pool_count = pool_space = 0;
    kept_total = 0;
}

uint64_t gs_pools_keeping(void) { return __atomic_load_n(&kept_total, __ATOMIC_RELAXED); }

/* Pool books; these need gs_held_lock. */
static void pool_unclaim_locked(uint64_t pool, uint64_t taken) {
    struct pool_books *p = pool_find(pool);
    if (p != NULL && taken) {
        p->allocated -= taken;
        kept_add((int64_t)taken);
    }
}

/* A freed pool allocation goes back to its pool, still counted: the pool keeps it. What
 * is to be given back now: all of it when the pool is destroyed, else nothing. */
uint64_t gs_pool_returned_locked(uint64_t pool, uint64_t bytes) {
    struct pool_books *p = pool_find(pool);
    if (p == NULL)
        return bytes;
    p->allocated -= bytes;
    if (p->destroyed) {
        p->counted -= bytes;
        pool_drop_if_done(p);
        return bytes;
    }
    kept_add((int64_t)bytes);
    return 0;
}

/* What the driver says `pool` holds now; UINT64_MAX when it cannot say. */
static uint64_t pool_reserved(uint64_t pool) {
    cuuint64_t value;
    if (GS_CALL_CUDA(cuMemPoolGetAttribute, (CUmemoryPool)(uintptr_t)pool,
                     CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &value) != CUDA_SUCCESS)
        return UINT64_MAX;
    return value;
}

/* Gives back what `pool` was charged beyond what the driver says it holds (never below
 * what its live allocations hold). */
static void pool_settle(uint64_t pool) {
    uint64_t reserved = pool_reserved(pool), back = 0;
    if (reserved == UINT64_MAX)
        return;
    int gpu = -1;
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool_find(pool);
    if (p != NULL) {
        uint64_t floor = reserved > p->allocated ? reserved : p->allocated;
        if (p->counted > floor) {
            back = p->counted - floor, gpu = p->gpu;
            p->counted = floor;
            kept_add(-(int64_t)back);
        }
    }
    pthread_mutex_unlock(&gs_held_lock);
    if (back)
        gs_unreserve(gpu, back);
}

#define SETTLED_AT_ONCE 64
void gs_pools_settle(void) {
    uint64_t keeping[SETTLED_AT_ONCE];
    int n = 0;
    pthread_mutex_lock(&gs_held_lock);
    for (int i = 0; i < pool_count && n < SETTLED_AT_ONCE; i++)
        if (pools[i].counted > pools[i].allocated)
            keeping[n++] = pools[i].pool;
    pthread_mutex_unlock(&gs_held_lock);
    for (int i = 0; i < n; i++)
        pool_settle(keeping[i]);
}

/* Pool allocations take from what the pool keeps before charging the GPU anew, so memory
 * reused from a pool is not counted twice. */
static uint64_t pool_claim(uint64_t pool, uint64_t bytes) {
    uint64_t taken = 0;
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool_find(pool);
    if (p != NULL && !p->destroyed) {
        uint64_t kept = p->counted - p->allocated;
        taken = kept < bytes ? kept : bytes;
        p->allocated += taken;
        kept_add(-(int64_t)taken);
    }
    pthread_mutex_unlock(&gs_held_lock);
    return taken;
}

static CUresult settle_pooled(CUresult rc, uint64_t pool, uint64_t key, int gpu, uint64_t bytes,
                              uint64_t taken) {
    uint64_t charged = bytes - taken;
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool_find(pool);
    struct gs_held h = {key, bytes, pool, 0, 0, GS_POINTER, (int8_t)gpu};
    if (rc == CUDA_SUCCESS && p != NULL && gs_held_insert(&h) == 0) {
        p->counted += charged, p->allocated += charged;
        charged = 0;
    } else {
        pool_unclaim_locked(pool, taken);
    }
    pthread_mutex_unlock(&gs_held_lock);
    if (charged)
        gs_unreserve(gpu, charged);
    return rc;
}

/* The books of `pool` on region GPU `gpu`, opened if new; 0: none to keep (no memory). */
static uint64_t pool_books_for(uint64_t pool, int gpu) {
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool ? pool_add(pool, gpu) : NULL;
    pthread_mutex_unlock(&gs_held_lock);
    return p ? pool : 0;
}

/* The device whose memory a pool holds: the one whose default or current pool it is, else
 * the calling thread's (a pool made before the library saw it). */
static CUresult device_of_pool(CUmemoryPool pool, CUdevice *device) {
    int count = 0;
    CUmemoryPool p;
    if (GS_CALL_CUDA(cuDeviceGetCount, &count) == CUDA_SUCCESS)
        for (CUdevice d = 0; d < count; d++)
            if ((GS_CALL_CUDA(cuDeviceGetDefaultMemPool, &p, d) == CUDA_SUCCESS && p == pool) ||
                (GS_CALL_CUDA(cuDeviceGetMemPool, &p, d) == CUDA_SUCCESS && p == pool))
                return *device = d, CUDA_SUCCESS;
    return gs_current_device(device);
}

/* cuMemAllocFromPoolAsync: the pool's device is charged, whatever the thread's is. */
static CUresult given_pool(CUmemoryPool handle, uint64_t *pool, int *gpu) {
    *pool = (uint64_t)(uintptr_t)handle;
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool_find(*pool);
    int known = p != NULL && !p->destroyed;
    if (known)
        *gpu = p->gpu;
    pthread_mutex_unlock(&gs_held_lock);
    if (known)
        return CUDA_SUCCESS;
    CUdevice device;
    CUresult rc = device_of_pool(handle, &device);
    if (rc != CUDA_SUCCESS)
        return rc;
    *gpu = gs_gpu_of_device(device);
    *pool = pool_books_for(*pool, *gpu);
    return CUDA_SUCCESS;
}

/* cuMemAllocAsync: the current pool of the calling thread's device. */
static CUresult context_pool(uint64_t *pool, int *gpu) {
    CUdevice device;
    CUresult rc = gs_current_device(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    *gpu = gs_gpu_of_device(device);
    CUmemoryPool handle = NULL;
    if (GS_CALL_CUDA(cuDeviceGetMemPool, &handle, device) != CUDA_SUCCESS)
        handle = NULL;
    *pool = pool_books_for((uint64_t)(uintptr_t)handle, *gpu);
    return CUDA_SUCCESS;
}

/* Pool 0 (the driver did not say which): counted as a plain allocation. */
#define POOL_ALLOCATION(name, which_pool, ...)                                     \
    do {                                                                           \
        gs_enter_cuda();                                                           \
        if (!gs_capping())                                                         \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                \
        uint64_t pool_key;                                                         \
        int gpu;                                                                   \
        CUresult rc = which_pool;                                                  \
        if (rc != CUDA_SUCCESS)                                                    \
            return rc;                                                             \
        if (gpu == HOST_POOL)                                                      \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                \
        if (gpu < 0)                                                               \
            return gs_admit(gpu, bytesize); /* refused: not the container's GPU */ \
        uint64_t taken = pool_key ? pool_claim(pool_key, bytesize) : 0;            \
        rc = gs_admit(gpu, bytesize - taken);                        \
        if (rc != CUDA_SUCCESS) {                                                  \
            pthread_mutex_lock(&gs_held_lock);                                     \
            pool_unclaim_locked(pool_key, taken);                                  \
            pthread_mutex_unlock(&gs_held_lock);                                   \
            return rc;                                                             \
        }                                                                          \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                      \
        uint64_t key = rc == CUDA_SUCCESS ? *dptr : 0;                             \
        return pool_key ? settle_pooled(rc, pool_key, key, gpu, bytesize, taken)   \
                        : gs_settle(rc, GS_POINTER, key, gpu, bytesize);           \
    } while (0)

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    POOL_ALLOCATION(cuMemAllocAsync, context_pool(&pool_key, &gpu), dptr, bytesize, stream);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    POOL_ALLOCATION(cuMemAllocAsync_ptsz, context_pool(&pool_key, &gpu), dptr, bytesize, stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream stream) {
    POOL_ALLOCATION(cuMemAllocFromPoolAsync, given_pool(pool, &pool_key, &gpu), dptr, bytesize,
                    pool, stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream stream) {
    POOL_ALLOCATION(cuMemAllocFromPoolAsync_ptsz, given_pool(pool, &pool_key, &gpu), dptr,
                    bytesize, pool, stream);
}

/* Pools: a device pool is charged to its device, a host pool to none. */
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemPoolCreate, pool, props);
    if (rc != CUDA_SUCCESS || !gs_capping() || pool == NULL || props == NULL)
        return rc;
    int gpu = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? gs_gpu_of_device(props->location.id)
                  : HOST_POOL;
    pool_books_for((uint64_t)(uintptr_t)*pool, gpu);
    return rc;
}

/* What it keeps goes back now; what its allocations hold, as they are freed. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemPoolDestroy, pool);
    if (rc != CUDA_SUCCESS || !gs_capping())
        return rc;
    uint64_t back = 0;
    int gpu = -1;
    pthread_mutex_lock(&gs_held_lock);
    struct pool_books *p = pool_find((uint64_t)(uintptr_t)pool);
    if (p != NULL) {
        back = p->counted - p->allocated, gpu = p->gpu;
        p->counted = p->allocated, p->destroyed = 1;
        kept_add(-(int64_t)back);
        pool_drop_if_done(p);
    }
    pthread_mutex_unlock(&gs_held_lock);
    if (back)
        gs_unreserve(gpu, back);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemPoolTrimTo, pool, min_bytes_to_keep);
    if (rc == CUDA_SUCCESS && gs_capping())
        pool_settle((uint64_t)(uintptr_t)pool);
    return rc;
}

/* A synchronize is where the driver releases what pools keep over their release threshold
 * (0 for a default pool): ask them what they hold, when any keeps something. */
static CUresult synchronized(CUresult rc) {
    if (rc == CUDA_SUCCESS && gs_capping() && __atomic_load_n(&kept_total, __ATOMIC_RELAXED))
        gs_pools_settle();
    return rc;
}

EXPORT CUresult cuCtxSynchronize(void) {
    gs_enter_cuda();
    return synchronized(GS_CALL_CUDA(cuCtxSynchronize));
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    gs_enter_cuda();
    return synchronized(GS_CALL_CUDA(cuStreamSynchronize, stream));
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
    gs_enter_cuda();
    return synchronized(GS_CALL_CUDA(cuStreamSynchronize_ptsz, stream));
}
