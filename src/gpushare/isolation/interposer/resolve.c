/*
 * The real driver functions: one pointer per hooks.def entry, and the table that names
 * them, filled from libcuda / libnvidia-ml (through the real dlsym, so the hooks never
 * find themselves) the first time a hook of that family is called.
 */
#define _GNU_SOURCE
#include <dlfcn.h>

#include "hooks.h"

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

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static void resolve_cuda(void) { resolve(GS_CUDA, "libcuda.so.1"); }
static void resolve_nvml(void) { resolve(GS_NVML, "libnvidia-ml.so.1"); }

void gs_resolve(enum gs_family family) {
    if (family == GS_CUDA)
        pthread_once(&cuda_once, resolve_cuda);
    else
        pthread_once(&nvml_once, resolve_nvml);
}
