/*
 * Allocation hooks: every path that takes device memory reserves it in the region
 * before the driver is asked (so a refused request never reaches it), gives it back
 * if the driver fails, and remembers what each pointer or handle holds so its free
 * returns exactly that.
 */
#include <stdlib.h>

#include "hooks.h"
#include "region.h"

/* What this process holds, by (kind, pointer or handle). Process-local: a pointer is
 * freed by the process that allocated it. An open-addressing table (linear probing,
 * backward-shift deletion) that doubles at 3/4 full, so that a free costs the same at a
 * million live allocations as at ten. */
enum kind { EMPTY, POINTER, HANDLE, ARRAY, MIPMAP, MAPPING };

struct held {
    uint64_t key;
    uint64_t bytes;    /* MAPPING: the length mapped */
    uint64_t link;     /* POINTER: the pool it came from (0: none); MAPPING: its handle */
    uint32_t handles;  /* HANDLE: unreleased handles of the physical allocation */
    uint32_t mappings; /* HANDLE: its mappings */
    uint8_t kind;
    int8_t gpu;
};

static struct held *table;
static unsigned table_bits;
static size_t table_count;
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t home_of(uint8_t kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> (64 - table_bits));
}

/* The table's functions need held_lock. */
static struct held *held_find(enum kind kind, uint64_t key) {
    if (table == NULL)
        return NULL;
    size_t mask = ((size_t)1 << table_bits) - 1;
    for (size_t i = home_of((uint8_t)kind, key); table[i].kind != EMPTY; i = (i + 1) & mask)
        if (table[i].key == key && table[i].kind == kind)
            return &table[i];
    return NULL;
}

static void held_place(const struct held *h) {
    size_t mask = ((size_t)1 << table_bits) - 1, i = home_of(h->kind, h->key);
    while (table[i].kind != EMPTY)
        i = (i + 1) & mask;
    table[i] = *h;
}

/* 0 kept; -1 no memory to grow into. Pointers into the table are stale afterwards. */
static int held_insert(const struct held *h) {
    if (table == NULL || (table_count + 1) * 4 > ((size_t)3 << table_bits)) {
        struct held *old = table;
        size_t old_size = old ? (size_t)1 << table_bits : 0;
        unsigned bits = old ? table_bits + 1 : 12;
        struct held *grown = calloc((size_t)1 << bits, sizeof *grown);
        if (grown == NULL)
            return -1;
        table = grown, table_bits = bits;
        for (size_t i = 0; i < old_size; i++)
            if (old[i].kind != EMPTY)
                held_place(&old[i]);
        free(old);
    }
    held_place(h);
    table_count++;
    return 0;
}

static void held_erase(struct held *h) {
    size_t mask = ((size_t)1 << table_bits) - 1, hole = (size_t)(h - table);
    table[hole].kind = EMPTY;
    for (size_t j = (hole + 1) & mask; table[j].kind != EMPTY; j = (j + 1) & mask) {
        size_t home = home_of(table[j].kind, table[j].key);
        /* It moves into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            table[hole] = table[j];
            table[j].kind = EMPTY;
            hole = j;
        }
    }
    table_count--;
}

static void remember_held(const struct held *h) {
    pthread_mutex_lock(&held_lock);
    int kept = held_insert(h);
    pthread_mutex_unlock(&held_lock);
    if (kept != 0)
        gs_unreserve(h->gpu, h->bytes); /* cannot track it: better uncounted than never freed */
}

static void remember(enum kind kind, uint64_t key, int gpu, uint64_t bytes) {
    struct held h = {key, bytes, 0, kind == HANDLE, 0, (uint8_t)kind, (int8_t)gpu};
    remember_held(&h);
}

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

void gs_memory_forked(void) {
    /* The child holds none of its parent's allocations (contexts do not survive fork). */
    free(table);
    table = NULL, table_bits = 0, table_count = 0;
    free(pools);
    pools = NULL, pool_count = pool_space = 0;
    kept_total = 0;
    pthread_mutex_init(&held_lock, NULL);
}

/* The region entry of the calling thread's device: its context decides where the
 * allocations without a location go. -1: not capped here. */
static CUresult context_gpu(int *gpu) {
    CUdevice device;
    CUresult rc = gs_current_device(&device);
    if (rc != CUDA_SUCCESS)
        return rc; /* the driver would refuse the allocation for the same reason */
    *gpu = gs_gpu_of_device(device);
    return CUDA_SUCCESS;
}

/* A process that fails closed takes the capped paths too, as far as admit(), which
 * refuses: it has no region (gs_gpu_of_device answers -1). */
static int capping(void) { return gs.active || gs.refusing != NULL; }

/* Reserve before the driver; CUDA_SUCCESS lets the call go on. A process that fails
 * closed, or a GPU that is not the container's, is refused (config.c or devices.c said why, once). */
static CUresult admit(int gpu, uint64_t bytes) {
    if (gs.refusing != NULL || gpu < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (gs_reserve(gpu, bytes))
        return CUDA_SUCCESS;
    gs_log(2, "refused %llu bytes on GPU %d: over its cap of %llu (%llu in use)",
           (unsigned long long)bytes, gpu, (unsigned long long)gs_cap(gpu),
           (unsigned long long)gs_region->gpus[gpu].used_bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* After the driver: keep the reservation with what it allocated, or give it back. */
static CUresult settle(CUresult rc, enum kind kind, uint64_t key, int gpu, uint64_t bytes) {
    if (gpu < 0)
        return rc;
    if (rc == CUDA_SUCCESS)
        remember(kind, key, gpu, bytes);
    else
        gs_unreserve(gpu, bytes);
    return rc;
}

/* Pool books; these need held_lock. */
static void pool_unclaim_locked(uint64_t pool, uint64_t taken) {
    struct pool_books *p = pool_find(pool);
    if (p != NULL && taken) {
        p->allocated -= taken;
        kept_add((int64_t)taken);
    }
}

/* A freed pool allocation goes back to its pool, still counted: the pool keeps it. What
 * is to be given back now: all of it when the pool is destroyed, else nothing. */
static uint64_t pool_returned_locked(uint64_t pool, uint64_t bytes) {
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

static void release(enum kind kind, uint64_t key, CUresult rc) {
    if (rc != CUDA_SUCCESS || !capping())
        return;
    pthread_mutex_lock(&held_lock);
    struct held *h = held_find(kind, key);
    int gpu = h ? h->gpu : -1;
    uint64_t back = h == NULL ? 0 : h->link ? pool_returned_locked(h->link, h->bytes) : h->bytes;
    if (h != NULL)
        held_erase(h);
    pthread_mutex_unlock(&held_lock);
    if (back)
        gs_unreserve(gpu, back);
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
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool_find(pool);
    if (p != NULL) {
        uint64_t floor = reserved > p->allocated ? reserved : p->allocated;
        if (p->counted > floor) {
            back = p->counted - floor, gpu = p->gpu;
            p->counted = floor;
            kept_add(-(int64_t)back);
        }
    }
    pthread_mutex_unlock(&held_lock);
    if (back)
        gs_unreserve(gpu, back);
}

#define SETTLED_AT_ONCE 64
static void settle_pools(void) {
    uint64_t keeping[SETTLED_AT_ONCE];
    int n = 0;
    pthread_mutex_lock(&held_lock);
    for (int i = 0; i < pool_count && n < SETTLED_AT_ONCE; i++)
        if (pools[i].counted > pools[i].allocated)
            keeping[n++] = pools[i].pool;
    pthread_mutex_unlock(&held_lock);
    for (int i = 0; i < n; i++)
        pool_settle(keeping[i]);
}

/* Before a request the cap would refuse while pools keep memory: ask the driver what they
 * still hold (a synchronize the library did not see may have released it). */
static uint64_t room(int gpu, uint64_t bytes) {
    if (gpu < 0 || gs_region == NULL || __atomic_load_n(&kept_total, __ATOMIC_RELAXED) == 0)
        return bytes;
    const struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t cap = gs_cap(gpu);
    uint64_t used = __atomic_load_n(&g->used_bytes, __ATOMIC_RELAXED);
    if (cap && (used > cap || bytes > cap - used))
        settle_pools();
    return bytes;
}

/* Allocations on the calling thread's device: cuMemAlloc*, cuMemAllocAsync*. */
#define CONTEXT_ALLOCATION(name, kind, key, bytes, ...)                      \
    do {                                                                     \
        gs_enter_cuda();                                                     \
        if (!capping())                                                      \
            return GS_CALL_CUDA(name, __VA_ARGS__);                             \
        int gpu;                                                             \
        CUresult rc = context_gpu(&gpu);                                     \
        if (rc == CUDA_SUCCESS)                                              \
            rc = admit(gpu, room(gpu, bytes));                               \
        if (rc != CUDA_SUCCESS)                                              \
            return rc;                                                       \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                   \
        return settle(rc, kind, rc == CUDA_SUCCESS ? (key) : 0, gpu, bytes); \
    } while (0)

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc, POINTER, *dptr, bytesize, dptr, bytesize);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CONTEXT_ALLOCATION(cuMemAlloc_v2, POINTER, *dptr, bytesize, dptr, bytesize);
}

/* Pool allocations take from what the pool keeps before charging the GPU anew, so memory
 * reused from a pool is not counted twice. */
static uint64_t pool_claim(uint64_t pool, uint64_t bytes) {
    uint64_t taken = 0;
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool_find(pool);
    if (p != NULL && !p->destroyed) {
        uint64_t kept = p->counted - p->allocated;
        taken = kept < bytes ? kept : bytes;
        p->allocated += taken;
        kept_add(-(int64_t)taken);
    }
    pthread_mutex_unlock(&held_lock);
    return taken;
}

static CUresult settle_pooled(CUresult rc, uint64_t pool, uint64_t key, int gpu, uint64_t bytes,
                              uint64_t taken) {
    uint64_t charged = bytes - taken;
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool_find(pool);
    struct held h = {key, bytes, pool, 0, 0, POINTER, (int8_t)gpu};
    if (rc == CUDA_SUCCESS && p != NULL && held_insert(&h) == 0) {
        p->counted += charged, p->allocated += charged;
        charged = 0;
    } else {
        pool_unclaim_locked(pool, taken);
    }
    pthread_mutex_unlock(&held_lock);
    if (charged)
        gs_unreserve(gpu, charged);
    return rc;
}

/* The books of `pool` on region GPU `gpu`, opened if new; 0: none to keep (no memory). */
static uint64_t pool_books_for(uint64_t pool, int gpu) {
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool ? pool_add(pool, gpu) : NULL;
    pthread_mutex_unlock(&held_lock);
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
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool_find(*pool);
    int known = p != NULL && !p->destroyed;
    if (known)
        *gpu = p->gpu;
    pthread_mutex_unlock(&held_lock);
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
#define POOL_ALLOCATION(name, which_pool, ...)                                        \
    do {                                                                              \
        gs_enter_cuda();                                                              \
        if (!capping())                                                               \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                      \
        uint64_t pool_key;                                                            \
        int gpu;                                                                      \
        CUresult rc = which_pool;                                                     \
        if (rc != CUDA_SUCCESS)                                                       \
            return rc;                                                                \
        if (gpu == HOST_POOL)                                                         \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                      \
        if (gpu < 0)                                                                  \
            return admit(gpu, bytesize); /* refused: not the container's GPU */       \
        uint64_t taken = pool_key ? pool_claim(pool_key, bytesize) : 0;               \
        rc = admit(gpu, room(gpu, bytesize - taken));                                 \
        if (rc != CUDA_SUCCESS) {                                                     \
            pthread_mutex_lock(&held_lock);                                           \
            pool_unclaim_locked(pool_key, taken);                                     \
            pthread_mutex_unlock(&held_lock);                                         \
            return rc;                                                                \
        }                                                                             \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                            \
        uint64_t key = rc == CUDA_SUCCESS ? *dptr : 0;                                \
        return pool_key ? settle_pooled(rc, pool_key, key, gpu, bytesize, taken)        \
                        : settle(rc, POINTER, key, gpu, bytesize);                        \
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

/* The driver rounds a pitch up to its alignment (at most 512 bytes on any GPU so far):
 * reserve that much, then settle on the pitch it chose, refusing if that is over. */
#define PITCH_ALIGNMENT 512u
static uint64_t pitched(uint64_t width, uint64_t height) {
    return (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT * height;
}

static CUresult settle_pitch(CUresult rc, uint64_t key, int gpu, uint64_t reserved,
                             uint64_t actual, CUresult (*undo)(uint64_t)) {
    if (rc != CUDA_SUCCESS || gpu < 0 || actual <= reserved) {
        if (rc == CUDA_SUCCESS && gpu >= 0)
            gs_unreserve(gpu, reserved - actual);
        return settle(rc, POINTER, key, gpu, rc == CUDA_SUCCESS ? actual : reserved);
    }
    if (gs_reserve(gpu, actual - reserved))
        return settle(rc, POINTER, key, gpu, actual);
    undo(key);
    gs_unreserve(gpu, reserved);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult undo_v1(uint64_t p) { return GS_CALL_CUDA(cuMemFree, (CUdeviceptr_v1)p); }
static CUresult undo_v2(uint64_t p) { return GS_CALL_CUDA(cuMemFree_v2, (CUdeviceptr)p); }

#define PITCH_ALLOCATION(name, undo, ...)                                                  \
    do {                                                                                   \
        gs_enter_cuda();                                                                   \
        if (!capping())                                                                    \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                           \
        int gpu;                                                                           \
        uint64_t reserved = pitched(width, height);                                        \
        CUresult rc = context_gpu(&gpu);                                                   \
        if (rc == CUDA_SUCCESS)                                                            \
            rc = admit(gpu, room(gpu, reserved));                                          \
        if (rc != CUDA_SUCCESS)                                                            \
            return rc;                                                                     \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                                 \
        return settle_pitch(rc, rc == CUDA_SUCCESS ? *dptr : 0, gpu, reserved,             \
                            rc == CUDA_SUCCESS ? (uint64_t)*pitch * height : 0, undo);     \
    } while (0)

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch, undo_v1, dptr, pitch, width, height, element_size);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                   unsigned int element_size) {
    PITCH_ALLOCATION(cuMemAllocPitch_v2, undo_v2, dptr, pitch, width, height, element_size);
}

/* cuMemCreate names its location: only device memory is capped; host and NUMA
 * locations pass through untouched (nothing to index with their id). */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    gs_enter_cuda();
    if (!capping() || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return GS_CALL_CUDA(cuMemCreate, handle, size, prop, flags);
    int gpu = gs_gpu_of_device(prop->location.id);
    CUresult rc = admit(gpu, room(gpu, size));
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = GS_CALL_CUDA(cuMemCreate, handle, size, prop, flags);
    return settle(rc, HANDLE, rc == CUDA_SUCCESS ? *handle : 0, gpu, size);
}

/* Arrays: the driver does not say what it allocated, so the texels are counted. */
static uint64_t texel_bytes(CUarray_format format, unsigned channels) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * channels;
    default: /* 32-bit formats, and a safe bound for the packed and block ones */
        return 4ull * channels;
    }
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format format,
                            unsigned channels) {
    return w * (h ? h : 1) * (d ? d : 1) * texel_bytes(format, channels);
}

static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels) {
    uint64_t total = 0, w = desc->Width, h = desc->Height, d = desc->Depth;
    for (unsigned l = 0; l < levels && (w | h | d); l++) {
        total += array_bytes(w ? w : 1, h, d, desc->Format, desc->NumChannels);
        w >>= 1, h >>= 1, d >>= 1;
    }
    return total;
}

#define ARRAY_ALLOCATION(name, kind, out, bytes_of, ...)                                 \
    do {                                                                                 \
        gs_enter_cuda();                                                                 \
        if (!capping() || desc == NULL || out == NULL)                                   \
            return GS_CALL_CUDA(name, __VA_ARGS__);                                         \
        int gpu;                                                                         \
        uint64_t bytes = bytes_of;                                                       \
        CUresult rc = context_gpu(&gpu);                                                 \
        if (rc == CUDA_SUCCESS)                                                          \
            rc = admit(gpu, room(gpu, bytes));                                           \
        if (rc != CUDA_SUCCESS)                                                          \
            return rc;                                                                   \
        rc = GS_CALL_CUDA(name, __VA_ARGS__);                                               \
        return settle(rc, kind, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*out : 0, gpu, \
                      bytes);                                                            \
    } while (0)

EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArrayCreate, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArrayCreate_v2, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    ARRAY_ALLOCATION(cuArray3DCreate_v2, ARRAY, array,
                     array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                 desc->NumChannels),
                     array, desc);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array,
                                       const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    ARRAY_ALLOCATION(cuMipmappedArrayCreate, MIPMAP, array, mipmap_bytes(desc, levels), array,
                     desc, levels);
}

/* Unified memory migrates to any GPU and can exceed the device: it cannot be held to a
 * cap, so under a region it is refused, as cGPU does, saying so once. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    gs_enter_cuda();
    if (!capping())
        return GS_CALL_CUDA(cuMemAllocManaged, dptr, bytesize, flags);
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        gs_log(1, "cuMemAllocManaged refused: unified memory cannot be capped under gpushare "
                  "(CUDA_ERROR_NOT_SUPPORTED)");
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define FREE(name, kind, key, ...)                         \
    do {                                                   \
        gs_enter_cuda();                                   \
        CUresult rc = GS_CALL_CUDA(name, __VA_ARGS__);        \
        release(kind, (uint64_t)(key), rc);                \
        return rc;                                         \
    } while (0)

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { FREE(cuMemFree, POINTER, dptr, dptr); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE(cuMemFree_v2, POINTER, dptr, dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync, POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    FREE(cuMemFreeAsync_ptsz, POINTER, dptr, dptr, stream);
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
    FREE(cuArrayDestroy, ARRAY, (uintptr_t)array, array);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    FREE(cuMipmappedArrayDestroy, MIPMAP, (uintptr_t)array, array);
}

/* VMM: cuMemCreate's physical allocation stays counted while an unreleased handle or a
 * mapping refers to it, as the driver keeps it: create -> map -> release (the usual
 * order) leaves it counted until the unmap. */
static void drop_if_unreferenced_locked(struct held *h, uint64_t back[GS_MAX_GPUS]) {
    if (h->handles == 0 && h->mappings == 0) {
        back[h->gpu] += h->bytes;
        held_erase(h);
    }
}

static void give_back(const uint64_t back[GS_MAX_GPUS]) {
    for (int gpu = 0; gpu < GS_MAX_GPUS; gpu++)
        if (back[gpu])
            gs_unreserve(gpu, back[gpu]);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemRelease, handle);
    if (rc != CUDA_SUCCESS || !capping())
        return rc;
    uint64_t back[GS_MAX_GPUS] = {0};
    pthread_mutex_lock(&held_lock);
    struct held *h = held_find(HANDLE, handle);
    if (h != NULL && h->handles > 0) {
        h->handles--;
        drop_if_unreferenced_locked(h, back);
    }
    pthread_mutex_unlock(&held_lock);
    give_back(back);
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemMap, ptr, size, offset, handle, flags);
    if (rc != CUDA_SUCCESS || !capping())
        return rc;
    pthread_mutex_lock(&held_lock);
    struct held *h = held_find(HANDLE, handle);
    if (h != NULL) {
        h->mappings++;
        struct held mapping = {ptr, size, handle, 0, 0, MAPPING, h->gpu};
        if (held_insert(&mapping) != 0)
            held_find(HANDLE, handle)->mappings--; /* untracked: its unmap finds nothing */
    }
    pthread_mutex_unlock(&held_lock);
    return rc;
}

/* The driver unmaps whole mappings only, so [ptr, ptr + size) is a run of them. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemUnmap, ptr, size);
    if (rc != CUDA_SUCCESS || !capping())
        return rc;
    uint64_t back[GS_MAX_GPUS] = {0};
    pthread_mutex_lock(&held_lock);
    struct held *mapping;
    for (uint64_t at = ptr; at < ptr + size && (mapping = held_find(MAPPING, at));) {
        uint64_t handle = mapping->link, length = mapping->bytes;
        held_erase(mapping);
        struct held *h = held_find(HANDLE, handle);
        if (h != NULL && h->mappings > 0) {
            h->mappings--;
            drop_if_unreferenced_locked(h, back);
        }
        if (length == 0)
            break;
        at += length;
    }
    pthread_mutex_unlock(&held_lock);
    give_back(back);
    return rc;
}

/* The driver hands out the handle the memory was mapped with, one more to release. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemRetainAllocationHandle, handle, addr);
    if (rc != CUDA_SUCCESS || !capping() || handle == NULL)
        return rc;
    pthread_mutex_lock(&held_lock);
    struct held *h = held_find(HANDLE, *handle);
    if (h != NULL)
        h->handles++;
    pthread_mutex_unlock(&held_lock);
    return rc;
}

/* Pools: a device pool is charged to its device, a host pool to none. */
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemPoolCreate, pool, props);
    if (rc != CUDA_SUCCESS || !capping() || pool == NULL || props == NULL)
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
    if (rc != CUDA_SUCCESS || !capping())
        return rc;
    uint64_t back = 0;
    int gpu = -1;
    pthread_mutex_lock(&held_lock);
    struct pool_books *p = pool_find((uint64_t)(uintptr_t)pool);
    if (p != NULL) {
        back = p->counted - p->allocated, gpu = p->gpu;
        p->counted = p->allocated, p->destroyed = 1;
        kept_add(-(int64_t)back);
        pool_drop_if_done(p);
    }
    pthread_mutex_unlock(&held_lock);
    if (back)
        gs_unreserve(gpu, back);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t min_bytes_to_keep) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuMemPoolTrimTo, pool, min_bytes_to_keep);
    if (rc == CUDA_SUCCESS && capping())
        pool_settle((uint64_t)(uintptr_t)pool);
    return rc;
}

/* A synchronize is where the driver releases what pools keep over their release threshold
 * (0 for a default pool): ask them what they hold, when any keeps something. */
static CUresult synchronized(CUresult rc) {
    if (rc == CUDA_SUCCESS && capping() && __atomic_load_n(&kept_total, __ATOMIC_RELAXED))
        settle_pools();
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

/* The container's share (gs_share_of), and free never more than the device has free. */
static CUresult memory_view(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t free_now, total_now;
    CUresult rc = GS_CALL_CUDA(cuMemGetInfo_v2, &free_now, &total_now);
    if (rc != CUDA_SUCCESS)
        return rc;
    *free_bytes = free_now, *total_bytes = total_now;
    int gpu;
    if (!capping() || context_gpu(&gpu) != CUDA_SUCCESS || gpu < 0)
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
    if (!capping())
        return GS_CALL_CUDA(cuMemGetInfo, free_bytes, total_bytes);
    uint64_t f, t;
    CUresult rc = memory_view(&f, &t);
    if (rc == CUDA_SUCCESS) { /* the 32-bit form saturates, as the driver's does */
        *free_bytes = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
        *total_bytes = t > 0xffffffffull ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}
