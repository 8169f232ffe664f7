/*
 * A stand-in for the NVIDIA driver's libcuda.so.1, for running the interposer and its
 * probes on a machine without a GPU. It keeps real books: each device has a size, every
 * allocation path takes from it and refuses (CUDA_ERROR_OUT_OF_MEMORY) when it is
 * exhausted, every free gives back, and it keeps memory as the real driver does: a VMM
 * physical allocation (cuMemCreate) lives while a handle or a mapping (cuMemMap) refers
 * to it; a memory pool keeps what its allocations leave behind until cuMemPoolTrimTo, a
 * synchronize (down to the pool's release threshold, 0 by default) or its destruction.
 * It says what reached it:
 *
 *   unsigned long long fakecuda_reached(int device)  physical bytes in use on it now
 *   long fakecuda_calls(const char *function)         times that export was called
 *   unsigned long long fakecuda_busy_ns(void)         time this process's kernels held
 *                                                     their device (its "GPU time")
 *
 * Configuration, read at cuInit:
 *   FAKE_CUDA_DEVICES="GPU-<uuid>:BYTES,..."  the devices, in ordinal order (default: one
 *                                            16 GiB device, GPU-00000000-0000-0000-0000-
 *                                            000000000000)
 *   FAKE_CUDA_INTERNAL_POINTERS=1            cuGetProcAddress hands out other entry points
 *                                            than the exports for cuMemAlloc(_v2) and
 *                                            cuLaunchKernel_ptsz, as a real driver may
 *   FAKE_CUDA_LOCKS=DIR                      serialise kernels per device across processes
 *                                            (flock on DIR/deviceN); else per process
 *   FAKE_CUDA_KERNELS=sleep                  kernels sleep rather than busy-wait, leaving
 *                                            the CPU to others (as a CPU waits on a GPU)
 *
 * Context limits as the real driver keeps them: each context starts with a 1 KiB stack
 * per thread and an 8 MiB malloc heap (and a 1 MiB printf FIFO); cuCtxSetLimit takes
 * from the device what a raise reserves beyond those defaults (the heap's bytes; the
 * stack's times FAKE_SMS x FAKE_THREADS_PER_SM, the threads the device holds resident, as
 * cuDeviceGetAttribute says) and refuses when the device has not that much, and a lower
 * gives it back. fakecuda_reached counts it; the defaults are context memory, not counted.
 *
 * Kernels take time: a launch busy-waits gridDimX microseconds (a graph launch, the
 * graph-exec handle's value in microseconds), one at a time per device.
 * cuGetProcAddress(_v2) answers as CUDA 12's: a base name, a CUDA version and the
 * per-thread-stream flag choose the versioned export (cuMemAlloc -> cuMemAlloc_v2 from
 * 3.2, cuLaunchKernel -> cuLaunchKernel_ptsz with the flag).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 16

struct device {
    CUuuid uuid;
    char name[64];
    uint64_t total;
    uint64_t used;
    int lock_fd;
    pthread_mutex_t kernel;
};

/* A memory pool keeps the physical memory its allocations leave behind: a free returns
 * the bytes to the pool, and only a trim (cuMemPoolTrimTo, or a synchronize down to the
 * release threshold) or the pool's destruction gives them back to the device. */
struct pool {
    int device; /* -1: a host pool */
    int destroyed;
    uint64_t threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: kept at a synchronize */
    uint64_t reserved;  /* physical bytes the pool holds */
    uint64_t used;      /* of those, in allocations not yet freed */
};

/* What the driver handed out, by (kind, key). A VMM physical allocation ('h') lives while
 * an unreleased handle or a mapping of it ('M') refers to it. */
struct allocation {
    uint64_t key;
    char kind;  /* 0 an empty slot; 'p' pointer, 'h' VMM handle, 'a' array, 'm' mipmapped
                   array, 'v' reserved address range, 'M' mapping of a handle at an address */
    int device; /* -1: host memory (or no memory: 'v', 'M') */
    uint64_t bytes;
    struct pool *pool;          /* 'p': the pool it came from, or NULL */
    uint64_t handle;            /* 'M': the physical allocation mapped */
    unsigned handles, mappings; /* 'h': its unreleased handles and its mappings */
};

static struct device devices[MAX_DEVICES];
static int device_count;
static int initialised;
static uint64_t next_key = 1;
static uint64_t next_address = 1ull << 40; /* reserved virtual address ranges */
static pthread_mutex_t books = PTHREAD_MUTEX_INITIALIZER;
#define FAKE_SMS 4
#define FAKE_THREADS_PER_SM 1024
#define LIMITS 3 /* stack, printf FIFO, malloc heap: CU_LIMIT_* 0 .. 2 */
static const size_t default_limit[LIMITS] = {1024, 1u << 20, 8u << 20};
static struct ctx {
    int device;
    size_t limit[LIMITS];
} contexts[MAX_DEVICES];
static __thread struct ctx *current;
#define MAX_POOLS 256
static struct pool pools[MAX_POOLS]; /* the devices' default pools first */
static int pool_count;
static struct pool *device_pool[MAX_DEVICES]; /* cuDeviceSetMemPool's choice */

/* Calls, by function name. */
#define MAX_FUNCTIONS 128
static struct {
    const char *name;
    long count;
} calls[MAX_FUNCTIONS];

static void called(const char *name) {
    pthread_mutex_lock(&books);
    for (int i = 0; i < MAX_FUNCTIONS; i++) {
        if (calls[i].name == NULL || strcmp(calls[i].name, name) == 0) {
            calls[i].name = name;
            calls[i].count++;
            break;
        }
    }
    pthread_mutex_unlock(&books);
}

EXPORT long fakecuda_calls(const char *name) {
    long n = 0;
    pthread_mutex_lock(&books);
    for (int i = 0; i < MAX_FUNCTIONS && calls[i].name; i++)
        if (strcmp(calls[i].name, name) == 0)
            n = calls[i].count;
    pthread_mutex_unlock(&books);
    return n;
}

EXPORT unsigned long long fakecuda_reached(int device) {
    pthread_mutex_lock(&books);
    unsigned long long used = device >= 0 && device < device_count ? devices[device].used : 0;
    pthread_mutex_unlock(&books);
    return used;
}

static int parse_uuid(const char *text, CUuuid *uuid) {
    if (strncmp(text, "GPU-", 4) != 0)
        return -1;
    text += 4;
    for (int i = 0; i < 16; i++) {
        if (*text == '-')
            text++;
        unsigned byte;
        if (sscanf(text, "%2x", &byte) != 1)
            return -1;
        uuid->bytes[i] = (char)byte;
        text += 2;
    }
    return 0;
}

static int sleeping_kernels;
static uint64_t busy_ns;

EXPORT unsigned long long fakecuda_busy_ns(void) {
    return __atomic_load_n(&busy_ns, __ATOMIC_RELAXED);
}

static void configure(void) {
    const char *kernels = getenv("FAKE_CUDA_KERNELS");
    sleeping_kernels = kernels != NULL && strcmp(kernels, "sleep") == 0;
    const char *spec = getenv("FAKE_CUDA_DEVICES");
    if (spec == NULL || *spec == '\0')
        spec = "GPU-00000000-0000-0000-0000-000000000000:17179869184";
    const char *locks = getenv("FAKE_CUDA_LOCKS");
    char entry[256];
    while (*spec && device_count < MAX_DEVICES) {
        size_t length = strcspn(spec, ",");
        snprintf(entry, sizeof entry, "%.*s", (int)length, spec);
        spec += length + (spec[length] == ',');
        char *colon = strrchr(entry, ':');
        struct device *d = &devices[device_count];
        if (colon == NULL || parse_uuid(entry, &d->uuid) != 0) {
            fprintf(stderr, "fakecuda: bad FAKE_CUDA_DEVICES entry %s\n", entry);
            continue;
        }
        d->total = strtoull(colon + 1, NULL, 10);
        snprintf(d->name, sizeof d->name, "Fake GPU %d", device_count);
        pthread_mutex_init(&d->kernel, NULL);
        d->lock_fd = -1;
        if (locks) {
            char path[4096];
            snprintf(path, sizeof path, "%s/device%d", locks, device_count);
            d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        }
        contexts[device_count].device = device_count;
        memcpy(contexts[device_count].limit, default_limit, sizeof default_limit);
        pools[device_count].device = device_count;
        device_pool[device_count] = &pools[device_count];
        device_count++;
    }
    pool_count = device_count;
}

static pthread_once_t configured = PTHREAD_ONCE_INIT;

EXPORT CUresult cuInit(unsigned int flags) {
    called(__func__);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&configured, configure);
    initialised = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version) {
    called(__func__);
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 12040;
    return CUDA_SUCCESS;
}

static CUresult valid_device(CUdevice device) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return device >= 0 && device < device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceGetCount(int *count) {
    called(__func__);
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = device_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    called(__func__);
    CUresult rc = valid_device(ordinal);
    if (rc == CUDA_SUCCESS)
        *device = ordinal;
    return rc;
}

EXPORT CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        snprintf(name, (size_t)length, "%s", devices[device].name);
    return rc;
}

static CUresult uuid_of(CUuuid *uuid, CUdevice device) {
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *uuid = devices[device].uuid;
    return rc;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device) {
    called(__func__);
    return uuid_of(uuid, device);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice device) {
    called(__func__);
    return uuid_of(uuid, device);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *bytes = devices[device].total;
    return rc;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (value != NULL && attribute == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        *value = FAKE_SMS;
    else if (value != NULL && attribute == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
        *value = FAKE_THREADS_PER_SM;
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *ctx = (CUcontext)&contexts[device];
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    called(__func__);
    return valid_device(device);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device) {
    called(__func__);
    (void)flags;
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *ctx = (CUcontext)(current = &contexts[device]);
    return rc;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    called(__func__);
    current = (struct ctx *)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) {
    called(__func__);
    *ctx = (CUcontext)current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
    called(__func__);
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = current->device;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    called(__func__);
    if (current == (struct ctx *)ctx)
        current = NULL;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *pool = (CUmemoryPool)&pools[device];
    return rc;
}

/* The books: an open-addressing table (linear probing, backward-shift deletion), so
 * that an allocation and a free cost the same at a million live allocations. */
static struct allocation *table;
static unsigned table_bits;
static size_t table_count;

static size_t slot_of(char kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)(unsigned char)kind << 56)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> (64 - table_bits));
}

static struct allocation *find(char kind, uint64_t key) {
    if (table == NULL)
        return NULL;
    size_t mask = ((size_t)1 << table_bits) - 1;
    for (size_t i = slot_of(kind, key); table[i].kind; i = (i + 1) & mask)
        if (table[i].key == key && table[i].kind == kind)
            return &table[i];
    return NULL;
}

static void place(const struct allocation *a) {
    size_t mask = ((size_t)1 << table_bits) - 1, i = slot_of(a->kind, a->key);
    while (table[i].kind)
        i = (i + 1) & mask;
    table[i] = *a;
}

/* Adds `a` (growing the table at 3/4 full): pointers into the table are stale after. */
static int insert(const struct allocation *a) {
    if (table == NULL || (table_count + 1) * 4 > ((size_t)3 << table_bits)) {
        struct allocation *old = table;
        size_t old_size = table ? (size_t)1 << table_bits : 0;
        unsigned bits = table ? table_bits + 1 : 10;
        struct allocation *grown = calloc((size_t)1 << bits, sizeof *grown);
        if (grown == NULL)
            return -1;
        table = grown, table_bits = bits;
        for (size_t i = 0; i < old_size; i++)
            if (old[i].kind)
                place(&old[i]);
        free(old);
    }
    place(a);
    table_count++;
    return 0;
}

static void erase(struct allocation *a) {
    size_t mask = ((size_t)1 << table_bits) - 1, hole = (size_t)(a - table);
    table[hole].kind = 0;
    for (size_t j = (hole + 1) & mask; table[j].kind; j = (j + 1) & mask) {
        size_t home = slot_of(table[j].kind, table[j].key);
        /* Move it into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            table[hole] = table[j];
            table[j].kind = 0;
            hole = j;
        }
    }
    table_count--;
}

/* Physical memory of a device (-1: host, not counted); the caller holds `books`. */
static CUresult charge(int device, uint64_t bytes) {
    if (device >= 0 && bytes > devices[device].total - devices[device].used)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (device >= 0)
        devices[device].used += bytes;
    return CUDA_SUCCESS;
}

static void discharge(int device, uint64_t bytes) {
    if (device >= 0)
        devices[device].used -= bytes;
}

/* A key that fits in 32 bits (the legacy exports' pointers) for 16 million allocations. */
static uint64_t new_key(void) { return 0x100000 + (next_key++ << 8); }

/* Takes `bytes` from `device` (-1: host) as a new allocation of `kind`, saying its key. */
static CUresult take(int device, uint64_t bytes, char kind, uint64_t *key) {
    if (device >= 0 && valid_device(device) != CUDA_SUCCESS)
        return valid_device(device);
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    CUresult rc = charge(device, bytes);
    if (rc == CUDA_SUCCESS) {
        struct allocation a = {new_key(), kind, device, bytes, NULL, 0, kind == 'h', 0};
        if (insert(&a) == 0)
            *key = a.key;
        else
            discharge(device, bytes), rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&books);
    return rc;
}

/* Releases down to `keep` bytes, never below what the pool's allocations hold. */
static void trim(struct pool *p, uint64_t keep) {
    uint64_t target = p->reserved < keep ? p->reserved : keep;
    if (target < p->used)
        target = p->used;
    discharge(p->device, p->reserved - target);
    p->reserved = target;
}

static CUresult give(uint64_t key, char kind) {
    pthread_mutex_lock(&books);
    struct allocation *a = find(kind, key);
    if (a == NULL) {
        pthread_mutex_unlock(&books);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct pool *p = a->pool;
    if (p != NULL) {
        p->used -= a->bytes; /* the pool keeps the memory */
        if (p->destroyed)
            trim(p, 0);
    } else {
        discharge(a->device, a->bytes);
    }
    erase(a);
    pthread_mutex_unlock(&books);
    return CUDA_SUCCESS;
}

/* At a synchronize, as the real driver does, each pool gives back what it keeps over its
 * release threshold. */
static void synchronize(void) {
    pthread_mutex_lock(&books);
    for (int i = 0; i < pool_count; i++)
        trim(&pools[i], pools[i].threshold);
    pthread_mutex_unlock(&books);
}

static CUresult in_context(int *device) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    *device = current->device;
    return CUDA_SUCCESS;
}

/* What `value` of `limit` reserves beyond its default: the heap's bytes, the stack's for
 * every resident thread, the printf FIFO's nothing (kept in context memory). */
static int limit_extra(CUlimit limit, size_t value, uint64_t *bytes) {
    uint64_t per_unit = limit == CU_LIMIT_STACK_SIZE ? FAKE_SMS * FAKE_THREADS_PER_SM
                        : limit == CU_LIMIT_MALLOC_HEAP_SIZE ? 1
                                                             : 0;
    uint64_t over = value > default_limit[limit] ? value - default_limit[limit] : 0;
    return __builtin_mul_overflow(over, per_unit, bytes) ? -1 : 0;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    called(__func__);
    int device;
    CUresult rc = in_context(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (limit < 0 || limit >= LIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    uint64_t before, after;
    limit_extra(limit, current->limit[limit], &before);
    if (limit_extra(limit, value, &after) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (after > before)
        rc = charge(device, after - before);
    else
        discharge(device, before - after);
    if (rc == CUDA_SUCCESS)
        current->limit[limit] = value;
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
    called(__func__);
    int device;
    CUresult rc = in_context(&device);
    if (rc == CUDA_SUCCESS && (value == NULL || limit < 0 || limit >= LIMITS))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&books);
        *value = current->limit[limit];
        pthread_mutex_unlock(&books);
    }
    return rc;
}

static CUresult context_alloc(uint64_t bytes, char kind, uint64_t *key) {
    int device;
    CUresult rc = in_context(&device);
    return rc == CUDA_SUCCESS ? take(device, bytes, kind, key) : rc;
}

EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes) {
    called(__func__);
    uint64_t key;
    CUresult rc = context_alloc(bytes, 'p', &key);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)key;
    return rc;
}

#define POINTER_ALLOC(bytes)                          \
    do {                                              \
        called(__func__);                             \
        uint64_t key;                                 \
        CUresult rc = context_alloc(bytes, 'p', &key); \
        if (rc == CUDA_SUCCESS)                       \
            *dptr = key;                              \
        return rc;                                    \
    } while (0)

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) { POINTER_ALLOC(bytes); }


static struct pool *pool_of(CUmemoryPool handle) {
    struct pool *p = (struct pool *)handle;
    return p >= pools && p < pools + pool_count && !p->destroyed ? p : NULL;
}

/* From the pool's spare bytes first; it grows by what they do not cover. */
static CUresult pool_alloc(CUdeviceptr *dptr, size_t bytes, CUmemoryPool handle) {
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    struct pool *p = pool_of(handle);
    CUresult rc = p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    uint64_t spare = p ? p->reserved - p->used : 0;
    uint64_t grow = bytes > spare ? bytes - spare : 0;
    if (rc == CUDA_SUCCESS)
        rc = charge(p->device, grow);
    if (rc == CUDA_SUCCESS) {
        struct allocation a = {new_key(), 'p', p->device, bytes, p, 0, 0, 0};
        if (insert(&a) == 0) {
            p->reserved += grow, p->used += bytes;
            *dptr = a.key;
        } else {
            discharge(p->device, grow), rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&books);
    return rc;
}

static CUresult context_pool_alloc(CUdeviceptr *dptr, size_t bytes) {
    int device;
    CUresult rc = in_context(&device);
    return rc == CUDA_SUCCESS ? pool_alloc(dptr, bytes, (CUmemoryPool)device_pool[device]) : rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    called(__func__);
    (void)stream;
    return context_pool_alloc(dptr, bytes);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    called(__func__);
    (void)stream;
    return context_pool_alloc(dptr, bytes);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
    called(__func__);
    (void)stream;
    return pool_alloc(dptr, bytes, pool);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes,
                                             CUmemoryPool pool, CUstream stream) {
    called(__func__);
    (void)stream;
    return pool_alloc(dptr, bytes, pool);
}

#define PITCH 512u
static uint64_t pitch_of(uint64_t width) { return (width + PITCH - 1) / PITCH * PITCH; }

EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                unsigned int height, unsigned int element) {
    called(__func__);
    (void)element;
    uint64_t key;
    CUresult rc = context_alloc(pitch_of(width) * height, 'p', &key);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)key, *pitch = (unsigned)pitch_of(width);
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                   size_t height, unsigned int element) {
    called(__func__);
    (void)element;
    uint64_t key;
    CUresult rc = context_alloc(pitch_of(width) * height, 'p', &key);
    if (rc == CUDA_SUCCESS)
        *dptr = key, *pitch = pitch_of(width);
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags) {
    (void)flags;
    POINTER_ALLOC(bytes);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    called(__func__);
    if (prop == NULL || handle == NULL || flags != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_INVALID)
        return CUDA_ERROR_INVALID_VALUE;
    if (device >= 0 && valid_device(device) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t key;
    CUresult rc = take(device, size, 'h', &key);
    if (rc == CUDA_SUCCESS)
        *handle = key;
    return rc;
}

static uint64_t texel(CUarray_format format, unsigned channels) {
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return channels;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2ull * channels;
    default:
        return 4ull * channels;
    }
}

static uint64_t extent(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned c) {
    return w * (h ? h : 1) * (d ? d : 1) * texel(f, c);
}

static CUresult array_alloc(CUarray *array, uint64_t bytes, char kind) {
    uint64_t key;
    CUresult rc = context_alloc(bytes, kind, &key);
    if (rc == CUDA_SUCCESS)
        *array = (CUarray)(uintptr_t)key;
    return rc;
}

EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    called(__func__);
    return array_alloc(array, extent(d->Width, d->Height, 1, d->Format, d->NumChannels), 'a');
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *d) {
    called(__func__);
    return array_alloc(array, extent(d->Width, d->Height, 1, d->Format, d->NumChannels), 'a');
}

EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    called(__func__);
    return array_alloc(array, extent(d->Width, d->Height, d->Depth, d->Format, d->NumChannels),
                       'a');
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    called(__func__);
    return array_alloc(array, extent(d->Width, d->Height, d->Depth, d->Format, d->NumChannels),
                       'a');
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned int levels) {
    called(__func__);
    uint64_t total = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < levels && (w | h | z); l++, w >>= 1, h >>= 1, z >>= 1)
        total += extent(w ? w : 1, h, z, d->Format, d->NumChannels);
    return array_alloc((CUarray *)array, total, 'm');
}

EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    called(__func__);
    return give(dptr, 'p');
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    called(__func__);
    return give(dptr, 'p');
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    called(__func__);
    (void)stream;
    return give(dptr, 'p');
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    called(__func__);
    (void)stream;
    return give(dptr, 'p');
}

/* A physical allocation no handle and no mapping refers to any more goes back. */
static void drop_if_unreferenced(struct allocation *physical) {
    if (physical->handles == 0 && physical->mappings == 0) {
        discharge(physical->device, physical->bytes);
        erase(physical);
    }
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct allocation *physical = find('h', handle);
    CUresult rc = physical && physical->handles ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        physical->handles--;
        drop_if_unreferenced(physical);
    }
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
    called(__func__);
    (void)alignment, (void)addr, (void)flags;
    if (ptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    struct allocation range = {next_address, 'v', -1, size, NULL, 0, 0, 0};
    CUresult rc = insert(&range) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        *ptr = next_address;
        next_address += (size + (4u << 20) - 1) / (2u << 20) * (2u << 20); /* and a gap */
    }
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    called(__func__);
    (void)size;
    return give(ptr, 'v');
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct allocation *physical = find('h', handle);
    CUresult rc = CUDA_SUCCESS;
    if (physical == NULL || physical->handles == 0 || flags != 0 || size == 0 ||
        offset + size > physical->bytes || find('M', ptr) != NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        physical->mappings++;
        struct allocation mapping = {ptr, 'M', -1, size, NULL, handle, 0, 0};
        if (insert(&mapping) != 0) {
            find('h', handle)->mappings--;
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&books);
    return rc;
}

/* Unmaps every mapping in [ptr, ptr + size), which must start with one. */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    called(__func__);
    pthread_mutex_lock(&books);
    CUresult rc = find('M', ptr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    struct allocation *mapping;
    for (uint64_t at = ptr; rc == CUDA_SUCCESS && at < ptr + size && (mapping = find('M', at));) {
        uint64_t handle = mapping->handle;
        at += mapping->bytes;
        erase(mapping);
        struct allocation *physical = find('h', handle);
        physical->mappings--;
        drop_if_unreferenced(physical);
    }
    pthread_mutex_unlock(&books);
    return rc;
}

static struct allocation *mapping_at(uint64_t address) {
    struct allocation *exact = find('M', address);
    if (exact != NULL || table == NULL)
        return exact;
    for (size_t i = 0; i < (size_t)1 << table_bits; i++)
        if (table[i].kind == 'M' && table[i].key <= address &&
            address < table[i].key + table[i].bytes)
            return &table[i];
    return NULL;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    called(__func__);
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    struct allocation *mapping = mapping_at((uint64_t)(uintptr_t)addr);
    if (mapping != NULL) {
        *handle = mapping->handle;
        find('h', mapping->handle)->handles++;
    }
    pthread_mutex_unlock(&books);
    return mapping ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice device) {
    called(__func__);
    CUresult rc = valid_device(device);
    if (rc == CUDA_SUCCESS)
        *pool = (CUmemoryPool)device_pool[device];
    return rc;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice device, CUmemoryPool pool) {
    called(__func__);
    CUresult rc = valid_device(device);
    struct pool *p = pool_of(pool);
    if (rc == CUDA_SUCCESS && (p == NULL || p->device != device))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        device_pool[device] = p;
    return rc;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    called(__func__);
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pool == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    int device = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : -1;
    if (props->location.type == CU_MEM_LOCATION_TYPE_INVALID ||
        (device >= 0 && valid_device(device) != CUDA_SUCCESS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&books);
    CUresult rc = pool_count < MAX_POOLS ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        pools[pool_count] = (struct pool){device, 0, 0, 0, 0};
        *pool = (CUmemoryPool)&pools[pool_count++];
    }
    pthread_mutex_unlock(&books);
    return rc;
}

/* Gives back what it keeps now, and the rest as its allocations are freed. */
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct pool *p = pool_of(pool);
    CUresult rc = p && p >= pools + device_count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        p->destroyed = 1;
        trim(p, 0);
        if (p->device >= 0 && device_pool[p->device] == p)
            device_pool[p->device] = &pools[p->device];
    }
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct pool *p = pool_of(pool);
    if (p != NULL)
        trim(p, keep);
    pthread_mutex_unlock(&books);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct pool *p = pool_of(pool);
    CUresult rc = p && value ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        p->threshold = *(cuuint64_t *)value;
    else if (rc == CUDA_SUCCESS && (attr < 1 || attr > 3)) /* else: a reuse policy flag */
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    called(__func__);
    pthread_mutex_lock(&books);
    struct pool *p = pool_of(pool);
    CUresult rc = p && value ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            *(cuuint64_t *)value = p->threshold;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *(cuuint64_t *)value = p->reserved;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = p->used;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&books);
    return rc;
}

EXPORT CUresult cuCtxSynchronize(void) {
    called(__func__);
    int device;
    CUresult rc = in_context(&device);
    if (rc == CUDA_SUCCESS)
        synchronize();
    return rc;
}

EXPORT CUresult cuStreamSynchronize(CUstream stream) {
    called(__func__);
    (void)stream;
    synchronize();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream stream) {
    called(__func__);
    (void)stream;
    synchronize();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
    called(__func__);
    return give((uintptr_t)array, 'a');
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
    called(__func__);
    return give((uintptr_t)array, 'm');
}

static CUresult memory_info(uint64_t *free_bytes, uint64_t *total) {
    int device;
    CUresult rc = in_context(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&books);
    *total = devices[device].total;
    *free_bytes = devices[device].total - devices[device].used;
    pthread_mutex_unlock(&books);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    called(__func__);
    uint64_t f, t;
    CUresult rc = memory_info(&f, &t);
    if (rc == CUDA_SUCCESS)
        *free_bytes = f, *total = t;
    return rc;
}

EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total) {
    called(__func__);
    uint64_t f, t;
    CUresult rc = memory_info(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = f > 0xffffffffull ? 0xffffffffu : (unsigned)f;
        *total = t > 0xffffffffull ? 0xffffffffu : (unsigned)t;
    }
    return rc;
}

/* A kernel: `micros` of busy time on the current context's device, one at a time. */
static CUresult run_kernel(uint64_t micros) {
    int device;
    CUresult rc = in_context(&device);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct device *d = &devices[device];
    pthread_mutex_lock(&d->kernel);
    if (d->lock_fd >= 0)
        flock(d->lock_fd, LOCK_EX);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (sleeping_kernels) {
        struct timespec length = {(time_t)(micros / 1000000u), (long)(micros % 1000000u) * 1000L};
        nanosleep(&length, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } else {
        do
            clock_gettime(CLOCK_MONOTONIC, &now);
        while ((uint64_t)(now.tv_sec - start.tv_sec) * 1000000u +
                   (uint64_t)((now.tv_nsec - start.tv_nsec) / 1000) <
               micros);
    }
    __atomic_fetch_add(&busy_ns,
                       (uint64_t)(now.tv_sec - start.tv_sec) * 1000000000u +
                           (uint64_t)(now.tv_nsec - start.tv_nsec),
                       __ATOMIC_RELAXED);
    if (d->lock_fd >= 0)
        flock(d->lock_fd, LOCK_UN);
    pthread_mutex_unlock(&d->kernel);
    return CUDA_SUCCESS;
}

#define KERNEL_ARGS                                                                            \
    CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,          \
        unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params

EXPORT CUresult cuLaunchKernel(KERNEL_ARGS, void **extra) {
    called(__func__);
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream,
        (void)params, (void)extra;
    return run_kernel(gx);
}
EXPORT CUresult cuLaunchKernel_ptsz(KERNEL_ARGS, void **extra) {
    called(__func__);
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream,
        (void)params, (void)extra;
    return run_kernel(gx);
}
EXPORT CUresult cuLaunchCooperativeKernel(KERNEL_ARGS) {
    called(__func__);
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream,
        (void)params;
    return run_kernel(gx);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(KERNEL_ARGS) {
    called(__func__);
    (void)f, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream,
        (void)params;
    return run_kernel(gx);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                 void **extra) {
    called(__func__);
    (void)f, (void)params, (void)extra;
    return config ? run_kernel(config->gridDimX) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra) {
    called(__func__);
    (void)f, (void)params, (void)extra;
    return config ? run_kernel(config->gridDimX) : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    called(__func__);
    (void)stream;
    return run_kernel((uintptr_t)exec);
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    called(__func__);
    (void)stream;
    return run_kernel((uintptr_t)exec);
}

/* cuGetProcAddress: base name, the CUDA version it appeared in, per-thread-stream form. */
EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

static const struct proc {
    const char *base;
    int since;
    int per_thread;
    void *function;
} procs[] = {
#define P(base, since, per_thread, function) {#base, since, per_thread, (void *)function},
    P(cuInit, 2000, 0, cuInit) P(cuDriverGetVersion, 2020, 0, cuDriverGetVersion)
    P(cuDeviceGet, 2000, 0, cuDeviceGet) P(cuDeviceGetCount, 2000, 0, cuDeviceGetCount)
    P(cuDeviceGetName, 2000, 0, cuDeviceGetName) P(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid)
    P(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2)
    P(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2)
    P(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain)
    P(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2)
    P(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool)
    P(cuCtxCreate, 3020, 0, cuCtxCreate_v2) P(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2)
    P(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent) P(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent)
    P(cuCtxGetDevice, 2000, 0, cuCtxGetDevice)
    P(cuCtxSetLimit, 3010, 0, cuCtxSetLimit) P(cuCtxGetLimit, 3010, 0, cuCtxGetLimit)
    P(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute)
    P(cuMemAlloc, 2000, 0, cuMemAlloc) P(cuMemAlloc, 3020, 0, cuMemAlloc_v2)
    P(cuMemAllocPitch, 2000, 0, cuMemAllocPitch) P(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2)
    P(cuMemAllocAsync, 11020, 0, cuMemAllocAsync)
    P(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz)
    P(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync)
    P(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz)
    P(cuMemAllocManaged, 6000, 0, cuMemAllocManaged) P(cuMemCreate, 10020, 0, cuMemCreate)
    P(cuArrayCreate, 2000, 0, cuArrayCreate) P(cuArrayCreate, 3020, 0, cuArrayCreate_v2)
    P(cuArray3DCreate, 2000, 0, cuArray3DCreate) P(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2)
    P(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate)
    P(cuMemFree, 2000, 0, cuMemFree) P(cuMemFree, 3020, 0, cuMemFree_v2)
    P(cuMemFreeAsync, 11020, 0, cuMemFreeAsync) P(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz)
    P(cuMemRelease, 10020, 0, cuMemRelease) P(cuArrayDestroy, 2000, 0, cuArrayDestroy)
    P(cuMemAddressReserve, 10020, 0, cuMemAddressReserve)
    P(cuMemAddressFree, 10020, 0, cuMemAddressFree) P(cuMemMap, 10020, 0, cuMemMap)
    P(cuMemUnmap, 10020, 0, cuMemUnmap)
    P(cuMemRetainAllocationHandle, 11000, 0, cuMemRetainAllocationHandle)
    P(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool)
    P(cuDeviceSetMemPool, 11020, 0, cuDeviceSetMemPool)
    P(cuMemPoolCreate, 11020, 0, cuMemPoolCreate) P(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy)
    P(cuMemPoolTrimTo, 11020, 0, cuMemPoolTrimTo)
    P(cuMemPoolSetAttribute, 11020, 0, cuMemPoolSetAttribute)
    P(cuMemPoolGetAttribute, 11020, 0, cuMemPoolGetAttribute)
    P(cuCtxSynchronize, 2000, 0, cuCtxSynchronize)
    P(cuStreamSynchronize, 2000, 0, cuStreamSynchronize)
    P(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz)
    P(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy)
    P(cuMemGetInfo, 2000, 0, cuMemGetInfo) P(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2)
    P(cuLaunchKernel, 4000, 0, cuLaunchKernel) P(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz)
    P(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx)
    P(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz)
    P(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel)
    P(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz)
    P(cuGraphLaunch, 10000, 0, cuGraphLaunch) P(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz)
    P(cuGetProcAddress, 11030, 0, cuGetProcAddress)
    P(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2)
#undef P
};

/* Entry points other than the exports, as a real driver may hand out: with
 * FAKE_CUDA_INTERNAL_POINTERS set, cuGetProcAddress answers these for three functions. */
static CUresult internal_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes) {
    return cuMemAlloc(dptr, bytes);
}
static CUresult internal_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    return cuMemAlloc_v2(dptr, bytes);
}
static CUresult internal_cuLaunchKernel_ptsz(KERNEL_ARGS, void **extra) {
    return cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}

static void *internal(void *function) {
    static const char *wanted;
    if (wanted == NULL)
        wanted = getenv("FAKE_CUDA_INTERNAL_POINTERS") ? "1" : "";
    if (*wanted == '\0')
        return function;
    if (function == (void *)cuMemAlloc)
        return (void *)internal_cuMemAlloc;
    if (function == (void *)cuMemAlloc_v2)
        return (void *)internal_cuMemAlloc_v2;
    if (function == (void *)cuLaunchKernel_ptsz)
        return (void *)internal_cuLaunchKernel_ptsz;
    return function;
}

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const struct proc *best = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        const struct proc *p = &procs[i];
        if (strcmp(p->base, symbol) != 0)
            continue;
        known = 1;
        if (p->since > version || (p->per_thread && !per_thread))
            continue;
        /* The newest version the caller asked for; its per-thread form when asked. */
        if (best == NULL || p->since > best->since ||
            (p->since == best->since && p->per_thread))
            best = p;
    }
    *pfn = best ? internal(best->function) : NULL;
    if (status)
        *status = best ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    called(__func__);
    return lookup(symbol, pfn, version, flags, NULL);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    called(__func__);
    return lookup(symbol, pfn, version, flags, status);
}
