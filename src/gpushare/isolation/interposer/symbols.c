/*
 * Symbol resolution: whichever way a program finds a driver function (a direct link,
 * dlopen + dlsym, or the driver's own cuGetProcAddress) it gets the hook.
 *
 * dlsym itself is exported from dlsym_entry.S, which asks gs_dlsym_hook() first and
 * otherwise tail-jumps to glibc's dlsym with the caller's return address intact, so
 * RTLD_NEXT keeps resolving relative to the real caller.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "hooks.h"

void *(*gs_real_dlsym)(void *, const char *) __attribute__((visibility("hidden")));
static pthread_once_t dlsym_once = PTHREAD_ONCE_INIT;

static void find_real_dlsym(void) {
    /* glibc 2.34 moved dlsym into libc (GLIBC_2.34); older ones only have 2.2.5. */
    void *found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (found == NULL)
        found = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    gs_real_dlsym = (void *(*)(void *, const char *))found;
}

void gs_resolve_dlsym(void) { pthread_once(&dlsym_once, find_real_dlsym); }

const struct gs_symbol *gs_symbol_named(const char *name) {
    for (int i = 0; i < gs_symbol_count; i++)
        if (gs_symbols[i].hook && strcmp(gs_symbols[i].name, name) == 0)
            return &gs_symbols[i];
    return NULL;
}

/* Called by the dlsym entry: the hook for a hooked name, else NULL (the entry then
 * jumps to the real dlsym). A handle that does not define the name still gets NULL. */
__attribute__((visibility("hidden"))) void *gs_dlsym_hook(void *handle, const char *name) {
    gs_resolve_dlsym();
    if (name == NULL || !((name[0] == 'c' && name[1] == 'u') || strncmp(name, "nvml", 4) == 0))
        return NULL;
    const struct gs_symbol *symbol = gs_symbol_named(name);
    if (symbol == NULL)
        return NULL;
    if (handle != RTLD_NEXT && gs_real_dlsym(handle, name) == NULL)
        return NULL;
    return symbol->hook;
}

static void *hook_named(const char *name) {
    const struct gs_symbol *symbol = gs_symbol_named(name);
    return symbol && symbol->family == GS_CUDA ? symbol->hook : NULL;
}

/* The export a CUDA 12 driver means by (base name, version, flags), among the hooked ones:
 * the per-thread-stream form when asked and hooked, else _v2 from the version it
 * appeared in (3.2 for the memory calls, 12.0 for cuGetProcAddress), else the base. */
static void *hook_by_name(const char *symbol, int cuda_version, cuuint64_t flags) {
    char name[128];
    void *hook;
    if (strlen(symbol) > sizeof name - 8)
        return NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(name, sizeof name, "%s_ptsz", symbol);
        if ((hook = hook_named(name)))
            return hook;
    }
    int v2_since = strcmp(symbol, "cuGetProcAddress") == 0 ? 12000 : 3020;
    snprintf(name, sizeof name, "%s_v2", symbol);
    if (cuda_version >= v2_since && (hook = hook_named(name)))
        return hook;
    return hook_named(symbol);
}

/* The hook for what the driver handed out: by pointer (one of the real functions, or a
 * hook already, when the driver hands out its exports and ours interpose), else by the
 * name the caller asked for. NULL: not a hooked function. */
static void *hook_for(const char *symbol, void *real, int cuda_version, cuuint64_t flags) {
    for (int i = 0; i < gs_symbol_count; i++)
        if (gs_symbols[i].hook && (*gs_symbols[i].real == real || gs_symbols[i].hook == real))
            return gs_symbols[i].hook;
    return hook_by_name(symbol, cuda_version, flags);
}

static void wrap(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags) {
    if (*pfn == NULL)
        return;
    void *hook = hook_for(symbol, *pfn, cuda_version, flags);
    if (hook)
        *pfn = hook;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                                 cuuint64_t flags) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuGetProcAddress, symbol, pfn, cuda_version, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn)
        wrap(symbol, pfn, cuda_version, flags);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    gs_enter_cuda();
    CUresult rc = GS_CALL_CUDA(cuGetProcAddress_v2, symbol, pfn, cuda_version, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn)
        wrap(symbol, pfn, cuda_version, flags);
    return rc;
}
