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

/* Among the hooks, the one whose real function is `real` (or that is `real`); else the one of the same
 * base name (suffixes _vN, _ptsz, _ptds aside) if exactly one hook has it. */
static void *hook_for(const char *symbol, void *real) {
    for (int i = 0; i < gs_symbol_count; i++)
        if (gs_symbols[i].hook && (*gs_symbols[i].real == real || gs_symbols[i].hook == real))
            return gs_symbols[i].hook; /* a driver may hand out its exports, ours by then */
    size_t length = strlen(symbol);
    void *only = NULL;
    int matches = 0;
    for (int i = 0; i < gs_symbol_count; i++) {
        const char *name = gs_symbols[i].name;
        if (gs_symbols[i].family != GS_CUDA || !gs_symbols[i].hook ||
            strncmp(name, symbol, length) != 0)
            continue;
        const char *rest = name + length;
        if (*rest == '\0' || (rest[0] == '_' && (rest[1] == 'v' || rest[1] == 'p')))
            only = gs_symbols[i].hook, matches++;
    }
    if (matches == 1)
        return only;
    if (matches > 1)
        gs_log(1, "cuGetProcAddress(%s) gave a function none of the hooks knows: not hooked",
               symbol);
    return NULL;
}

static void wrap(const char *symbol, void **pfn) {
    if (*pfn == NULL)
        return;
    void *hook = hook_for(symbol, *pfn);
    if (hook)
        *pfn = hook;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                                 cuuint64_t flags) {
    gs_enter_cuda();
    if (real_cuGetProcAddress == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real_cuGetProcAddress(symbol, pfn, cuda_version, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn)
        wrap(symbol, pfn);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status) {
    gs_enter_cuda();
    if (real_cuGetProcAddress_v2 == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult rc = real_cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn)
        wrap(symbol, pfn);
    return rc;
}
