/*
 * dlsym(RTLD_NEXT) through the interposer's dlsym. Built three ways:
 *   -DLIBRARY_FIRST   libfirst.so: twice() = 1, and next_twice(), which calls the twice()
 *                     that follows libfirst in the lookup order
 *   -DLIBRARY_SECOND  libsecond.so: twice() = 2
 *   -DPROGRAM         prints "next_twice=N malloc_next_is_libc=0|1", linked to both in order
 * glibc resolves RTLD_NEXT relative to the library that called dlsym: libfirst's call must
 * find libsecond's twice (2). A dlsym wrapper that loses its caller would look after
 * itself (a preloaded library) instead and find libfirst's (1).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(LIBRARY_FIRST)
int twice(void) { return 1; }
int next_twice(void) {
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "twice");
    return next ? next() : -1;
}
void *next_malloc(void) { return dlsym(RTLD_NEXT, "malloc"); }
#elif defined(LIBRARY_SECOND)
int twice(void) { return 2; }
#elif defined(PROGRAM)
int next_twice(void);
void *next_malloc(void);
int main(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    printf("next_twice=%d malloc_next_is_libc=%d\n", next_twice(),
           libc != NULL && next_malloc() == dlsym(libc, "malloc"));
    return 0;
}
#endif
