/*
 * A CUDA program for the interposer's tests, finding the driver's functions the way the
 * first argument says:
 *   link     direct references, linked against libcuda.so.1 (what LD_PRELOAD interposes)
 *   dlsym    dlopen("libcuda.so.1") + dlsym of each exact name
 *   getproc  cuGetProcAddress_v2 (itself found by dlsym) with a base name, a CUDA version
 *            and the per-thread flag, as the CUDA runtime asks
 * then running the commands that follow, one output line each, "word key=value ...":
 *   init DEVICE              cuInit, retain DEVICE's primary context, make it current
 *   alloc KIND BYTES         allocate by KIND (see kinds[]), remember it as id=N
 *   free N                   free allocation N with its kind's free (an async free, then
 *                            a synchronize of its stream, which empties a default pool)
 *   info | info_v1 | info_null   cuMemGetInfo_v2, cuMemGetInfo, cuMemGetInfo_v2(NULL, NULL)
 *   launch KIND MICROS       a kernel of MICROS microseconds by KIND (see launches[])
 *   limit KIND BYTES         cuCtxSetLimit of KIND (stack, printf, heap), then
 *                            cuCtxGetLimit: what the context's limit is now
 *   reached DEVICE           the fake's bytes allocated on DEVICE
 *   calls FUNCTION           the fake's count of calls of FUNCTION
 *   sleep MS
 *   nvml UUID                the NVML memory info of the GPU of that UUID, as a program
 *                            that dlopens libnvidia-ml.so.1 (nvidia-smi, pynvml) sees it
 *   wait                     read one line from standard input (a start signal)
 *   loop KIND MICROS MS      launch kernels of MICROS by KIND, back to back, for MS
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

#define CUDA_HOOK(name, params) \
    CUresult name params;       \
    typedef CUresult(*name##_fn) params;
#include "hooks.def"
CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice device);
CUresult cuCtxGetLimit(size_t *value, CUlimit limit);
unsigned long long fakecuda_reached(int device);
long fakecuda_calls(const char *name);
unsigned long long fakecuda_busy_ns(void);

static const struct {
    const char *name;
    void *function;
} linked[] = {
#define CUDA_HOOK(name, params) {#name, (void *)name},
#include "hooks.def"
    {"cuInit", (void *)cuInit},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuDeviceGetDefaultMemPool", (void *)cuDeviceGetDefaultMemPool},
    {"cuCtxGetLimit", (void *)cuCtxGetLimit},
    {"fakecuda_reached", (void *)fakecuda_reached},
    {"fakecuda_calls", (void *)fakecuda_calls},
    {"fakecuda_busy_ns", (void *)fakecuda_busy_ns},
};

static const char *mode;

/* NVML as a monitoring program uses it: its own dlopen, then dlsym of each name. */
static int nvml_memory(const char *uuid, unsigned long long *total, unsigned long long *used) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml == NULL)
        return -1;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(nvml, "nvmlInit_v2");
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *) =
        (nvmlReturn_t(*)(const char *, nvmlDevice_t *))dlsym(nvml, "nvmlDeviceGetHandleByUUID");
    nvmlReturn_t (*info)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))dlsym(nvml, "nvmlDeviceGetMemoryInfo");
    if (init == NULL || by_uuid == NULL || info == NULL)
        return -2;
    nvmlDevice_t device;
    nvmlMemory_t memory;
    nvmlReturn_t rc = init();
    if (rc == 0)
        rc = by_uuid(uuid, &device);
    if (rc == 0)
        rc = info(device, &memory);
    if (rc == 0)
        *total = memory.total, *used = memory.used;
    return rc;
}
static void *driver;
static cuGetProcAddress_v2_fn get_proc;

/* The function `name` (the exact export) or, by cuGetProcAddress, `base` at `version`. */
static void *find(const char *name, const char *base, int version, int per_thread) {
    if (strcmp(mode, "link") == 0) {
        for (size_t i = 0; i < sizeof linked / sizeof linked[0]; i++)
            if (strcmp(linked[i].name, name) == 0)
                return linked[i].function;
        return NULL;
    }
    if (strcmp(mode, "getproc") == 0 && base != NULL) {
        void *pfn = NULL;
        CUdriverProcAddressQueryResult status;
        get_proc(base, &pfn, version,
                 per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &status);
        return pfn;
    }
    return dlsym(driver, name);
}

#define FIND(name) ((name##_fn)find(#name, NULL, 0, 0))
typedef CUresult (*cuInit_fn)(unsigned int);
typedef CUresult (*cuDevicePrimaryCtxRetain_fn)(CUcontext *, CUdevice);
typedef CUresult (*cuCtxSetCurrent_fn)(CUcontext);
typedef CUresult (*cuCtxGetLimit_fn)(size_t *, CUlimit);
typedef unsigned long long (*fakecuda_reached_fn)(int);
typedef long (*fakecuda_calls_fn)(const char *);
typedef unsigned long long (*fakecuda_busy_ns_fn)(void);

/* Allocation kinds: the export, and how cuGetProcAddress names it; the same for its free. */
static const struct kind {
    const char *kind, *name, *base;
    int version, per_thread;
    const char *free_name, *free_base;
    int free_version;
} kinds[] = {
    {"mem_v1", "cuMemAlloc", "cuMemAlloc", 3000, 0, "cuMemFree", "cuMemFree", 3000},
    {"mem", "cuMemAlloc_v2", "cuMemAlloc", 12000, 0, "cuMemFree_v2", "cuMemFree", 12000},
    {"pitch_v1", "cuMemAllocPitch", "cuMemAllocPitch", 3000, 0, "cuMemFree", "cuMemFree", 3000},
    {"pitch", "cuMemAllocPitch_v2", "cuMemAllocPitch", 12000, 0, "cuMemFree_v2", "cuMemFree",
     12000},
    {"async", "cuMemAllocAsync", "cuMemAllocAsync", 12000, 0, "cuMemFreeAsync",
     "cuMemFreeAsync", 12000},
    {"async_ptsz", "cuMemAllocAsync_ptsz", "cuMemAllocAsync", 12000, 1, "cuMemFreeAsync_ptsz",
     "cuMemFreeAsync", 12000},
    {"pool", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 12000, 0, "cuMemFreeAsync",
     "cuMemFreeAsync", 12000},
    {"pool_ptsz", "cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync", 12000, 1,
     "cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12000},
    {"create", "cuMemCreate", "cuMemCreate", 12000, 0, "cuMemRelease", "cuMemRelease", 12000},
    {"create_host", "cuMemCreate", "cuMemCreate", 12000, 0, "cuMemRelease", "cuMemRelease",
     12000},
    {"array_v1", "cuArrayCreate", "cuArrayCreate", 3000, 0, "cuArrayDestroy", "cuArrayDestroy",
     3000},
    {"array", "cuArrayCreate_v2", "cuArrayCreate", 12000, 0, "cuArrayDestroy", "cuArrayDestroy",
     12000},
    {"array3d_v1", "cuArray3DCreate", "cuArray3DCreate", 3000, 0, "cuArrayDestroy",
     "cuArrayDestroy", 3000},
    {"array3d", "cuArray3DCreate_v2", "cuArray3DCreate", 12000, 0, "cuArrayDestroy",
     "cuArrayDestroy", 12000},
    {"mipmap", "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 12000, 0,
     "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 12000},
    {"managed", "cuMemAllocManaged", "cuMemAllocManaged", 12000, 0, "cuMemFree_v2", "cuMemFree",
     12000},
};

static const struct kind *kind_named(const char *name) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(kinds[i].kind, name) == 0)
            return &kinds[i];
    fprintf(stderr, "probe: no allocation kind %s\n", name);
    exit(2);
}

static int device;
static struct {
    const struct kind *kind;
    uint64_t key;
} held[4096];
static int held_count;

static CUresult allocate(const struct kind *k, uint64_t bytes, uint64_t *key) {
    void *f = find(k->name, k->base, k->version, k->per_thread);
    if (f == NULL)
        return -1;
    CUstream stream = NULL;
    if (strncmp(k->kind, "mem_v1", 6) == 0) {
        CUdeviceptr_v1 p = 0;
        CUresult rc = ((cuMemAlloc_fn)f)(&p, (unsigned)bytes);
        return *key = p, rc;
    }
    if (strcmp(k->kind, "mem") == 0 || strcmp(k->kind, "managed") == 0) {
        CUdeviceptr p = 0;
        CUresult rc = strcmp(k->kind, "mem") == 0 ? ((cuMemAlloc_v2_fn)f)(&p, bytes)
                                                  : ((cuMemAllocManaged_fn)f)(&p, bytes, 1);
        return *key = p, rc;
    }
    if (strcmp(k->kind, "pitch_v1") == 0) {
        CUdeviceptr_v1 p = 0;
        unsigned pitch;
        CUresult rc = ((cuMemAllocPitch_fn)f)(&p, &pitch, (unsigned)bytes, 1, 4);
        return *key = p, rc;
    }
    if (strcmp(k->kind, "pitch") == 0) {
        CUdeviceptr p = 0;
        size_t pitch;
        CUresult rc = ((cuMemAllocPitch_v2_fn)f)(&p, &pitch, bytes, 1, 4);
        return *key = p, rc;
    }
    if (strncmp(k->kind, "async", 5) == 0) {
        CUdeviceptr p = 0;
        CUresult rc = ((cuMemAllocAsync_fn)f)(&p, bytes, stream);
        return *key = p, rc;
    }
    if (strncmp(k->kind, "pool", 4) == 0) {
        typedef CUresult (*pool_fn)(CUmemoryPool *, CUdevice);
        CUmemoryPool pool;
        ((pool_fn)find("cuDeviceGetDefaultMemPool", NULL, 0, 0))(&pool, device);
        CUdeviceptr p = 0;
        CUresult rc = ((cuMemAllocFromPoolAsync_fn)f)(&p, bytes, pool, stream);
        return *key = p, rc;
    }
    if (strncmp(k->kind, "create", 6) == 0) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = strcmp(k->kind, "create") == 0 ? CU_MEM_LOCATION_TYPE_DEVICE
                                                            : CU_MEM_LOCATION_TYPE_HOST;
        prop.location.id = strcmp(k->kind, "create") == 0 ? device : 0;
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = ((cuMemCreate_fn)f)(&h, bytes, &prop, 0);
        return *key = h, rc;
    }
    CUarray array = NULL;
    CUresult rc;
    if (strcmp(k->kind, "array_v1") == 0) {
        CUDA_ARRAY_DESCRIPTOR_v1 d = {(unsigned)bytes, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
        rc = ((cuArrayCreate_fn)f)(&array, &d);
    } else if (strcmp(k->kind, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR d = {bytes, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1};
        rc = ((cuArrayCreate_v2_fn)f)(&array, &d);
    } else if (strcmp(k->kind, "array3d_v1") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR_v1 d = {(unsigned)bytes, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        rc = ((cuArray3DCreate_fn)f)(&array, &d);
    } else if (strcmp(k->kind, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        rc = ((cuArray3DCreate_v2_fn)f)(&array, &d);
    } else {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes, 0, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
        rc = ((cuMipmappedArrayCreate_fn)f)((CUmipmappedArray *)&array, &d, 1);
    }
    *key = (uintptr_t)array;
    return rc;
}

static CUresult release(const struct kind *k, uint64_t key) {
    void *f = find(k->free_name, k->free_base, k->free_version, k->per_thread);
    if (f == NULL)
        return -1;
    if (strcmp(k->free_name, "cuMemFree") == 0)
        return ((cuMemFree_fn)f)((CUdeviceptr_v1)key);
    if (strcmp(k->free_name, "cuMemFree_v2") == 0)
        return ((cuMemFree_v2_fn)f)(key);
    if (strncmp(k->free_name, "cuMemFreeAsync", 14) == 0) {
        /* And waits for it: the pool gives the bytes back at the synchronize. */
        CUresult rc = ((cuMemFreeAsync_fn)f)(key, NULL);
        void *sync = find(k->per_thread ? "cuStreamSynchronize_ptsz" : "cuStreamSynchronize",
                          "cuStreamSynchronize", 12000, k->per_thread);
        return rc == CUDA_SUCCESS && sync ? ((CUresult(*)(CUstream))sync)(NULL) : rc;
    }
    if (strcmp(k->free_name, "cuMemRelease") == 0)
        return ((cuMemRelease_fn)f)(key);
    if (strcmp(k->free_name, "cuArrayDestroy") == 0)
        return ((cuArrayDestroy_fn)f)((CUarray)(uintptr_t)key);
    return ((cuMipmappedArrayDestroy_fn)f)((CUmipmappedArray)(uintptr_t)key);
}

static CUresult launch(const char *kind, unsigned micros) {
    int per_thread = strstr(kind, "_ptsz") != NULL;
    char name[64];
    static const char *const bases[][2] = {{"kernel", "cuLaunchKernel"},
                                           {"ex", "cuLaunchKernelEx"},
                                           {"coop", "cuLaunchCooperativeKernel"},
                                           {"graph", "cuGraphLaunch"}};
    const char *base = NULL;
    for (size_t i = 0; i < 4; i++)
        if (strncmp(kind, bases[i][0], strlen(bases[i][0])) == 0)
            base = bases[i][1];
    if (base == NULL)
        return -1;
    snprintf(name, sizeof name, "%s%s", base, per_thread ? "_ptsz" : "");
    void *f = find(name, base, 12000, per_thread);
    if (f == NULL)
        return -1;
    if (strcmp(base, "cuLaunchKernel") == 0)
        return ((cuLaunchKernel_fn)f)(NULL, micros, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (strcmp(base, "cuLaunchCooperativeKernel") == 0)
        return ((cuLaunchCooperativeKernel_fn)f)(NULL, micros, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (strcmp(base, "cuLaunchKernelEx") == 0) {
        CUlaunchConfig config = {micros, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
        return ((cuLaunchKernelEx_fn)f)(&config, NULL, NULL, NULL);
    }
    return ((cuGraphLaunch_fn)f)((CUgraphExec)(uintptr_t)micros, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: probe link|dlsym|getproc COMMAND...\n");
        return 2;
    }
    mode = argv[1];
    driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver == NULL) {
        fprintf(stderr, "probe: %s\n", dlerror());
        return 2;
    }
    get_proc = (cuGetProcAddress_v2_fn)dlsym(driver, "cuGetProcAddress_v2");
    for (int i = 2; i < argc; i++) {
        const char *command = argv[i];
        const char *arg = i + 1 < argc ? argv[i + 1] : "0";
        if (strcmp(command, "init") == 0) {
            device = atoi(arg), i++;
            CUcontext ctx;
            CUresult rc = FIND(cuInit)(0);
            if (rc == CUDA_SUCCESS)
                rc = FIND(cuDevicePrimaryCtxRetain)(&ctx, device);
            if (rc == CUDA_SUCCESS)
                rc = FIND(cuCtxSetCurrent)(ctx);
            printf("init device=%d rc=%d\n", device, rc);
        } else if (strcmp(command, "alloc") == 0) {
            const struct kind *k = kind_named(arg);
            uint64_t key = 0, bytes = strtoull(argv[i + 2], NULL, 10);
            i += 2;
            CUresult rc = allocate(k, bytes, &key);
            int id = -1;
            if (rc == CUDA_SUCCESS)
                held[held_count].kind = k, held[held_count].key = key, id = held_count++;
            printf("alloc kind=%s rc=%d id=%d\n", k->kind, rc, id);
        } else if (strcmp(command, "free") == 0) {
            int id = atoi(arg);
            i++;
            CUresult rc = id >= 0 && id < held_count ? release(held[id].kind, held[id].key) : -1;
            printf("free id=%d rc=%d\n", id, rc);
        } else if (strncmp(command, "info", 4) == 0) {
            CUresult rc;
            unsigned long long f = 0, t = 0;
            if (strcmp(command, "info_v1") == 0) {
                unsigned f1 = 0, t1 = 0;
                rc = ((cuMemGetInfo_fn)find("cuMemGetInfo", "cuMemGetInfo", 3000, 0))(&f1, &t1);
                f = f1, t = t1;
            } else {
                cuMemGetInfo_v2_fn info = (cuMemGetInfo_v2_fn)find("cuMemGetInfo_v2",
                                                                   "cuMemGetInfo", 12000, 0);
                size_t f2 = 0, t2 = 0;
                rc = strcmp(command, "info_null") == 0 ? info(NULL, NULL) : info(&f2, &t2);
                f = f2, t = t2;
            }
            printf("%s rc=%d free=%llu total=%llu\n", command, rc, f, t);
        } else if (strcmp(command, "launch") == 0) {
            unsigned micros = (unsigned)atoi(argv[i + 2]);
            printf("launch kind=%s rc=%d\n", arg, launch(arg, micros));
            i += 2;
        } else if (strcmp(command, "limit") == 0) {
            const char *names[] = {"stack", "printf", "heap"};
            CUlimit limit = 0;
            while (limit < 2 && strcmp(names[limit], arg) != 0)
                limit++;
            size_t now = 0;
            CUresult rc = ((cuCtxSetLimit_fn)find("cuCtxSetLimit", "cuCtxSetLimit", 12000, 0))(
                limit, strtoull(argv[i + 2], NULL, 10));
            CUresult got = ((cuCtxGetLimit_fn)find("cuCtxGetLimit", "cuCtxGetLimit", 12000, 0))(
                &now, limit);
            printf("limit kind=%s rc=%d now=%zu get_rc=%d\n", names[limit], rc, now, got);
            i += 2;
        } else if (strcmp(command, "reached") == 0) {
            i++;
            printf("reached device=%d bytes=%llu\n", atoi(arg), FIND(fakecuda_reached)(atoi(arg)));
        } else if (strcmp(command, "calls") == 0) {
            i++;
            printf("calls function=%s count=%ld\n", arg, FIND(fakecuda_calls)(arg));
        } else if (strcmp(command, "nvml") == 0) {
            i++;
            unsigned long long total = 0, used = 0;
            int rc = nvml_memory(arg, &total, &used);
            printf("nvml rc=%d total=%llu used=%llu\n", rc, total, used);
        } else if (strcmp(command, "wait") == 0) {
            char line[64];
            if (!fgets(line, sizeof line, stdin))
                return 3;
            printf("waited\n");
        } else if (strcmp(command, "loop") == 0) {
            unsigned micros = (unsigned)atoi(argv[i + 2]);
            double limit = atoi(argv[i + 3]) / 1e3, elapsed = 0;
            struct timespec start, now;
            clock_gettime(CLOCK_MONOTONIC, &start);
            long n = 0;
            while (elapsed < limit) {
                if (launch(arg, micros) != 0)
                    return 4;
                n++;
                clock_gettime(CLOCK_MONOTONIC, &now);
                elapsed = (double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
            }
            printf("loop kind=%s launches=%ld seconds=%.6f busy_ns=%llu\n", arg, n, elapsed,
                   FIND(fakecuda_busy_ns)());
            i += 3;
        } else if (strcmp(command, "sleep") == 0) {
            i++;
            struct timespec t = {atoi(arg) / 1000, (atoi(arg) % 1000) * 1000000L};
            nanosleep(&t, NULL);
            printf("slept ms=%d\n", atoi(arg));
        } else {
            fprintf(stderr, "probe: unknown command %s\n", command);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
