/*
 * What the library says and when: its log lines on stderr (GPUSHARE_CUDA_LOG chooses how
 * many), the clock every timestamp in the region is taken from, and the one way a
 * process fails closed (leaving a file that says so, refusals.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"

static char refusal[400];

uint64_t gs_now_ns(void) {
    struct timespec t; /* vDSO: no system call */
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

void gs_log(int level, const char *format, ...) {
    if (level > gs.log_level)
        return;
    char line[512];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    fprintf(stderr, "gpushare-cuda[%d]: %s\n", (int)getpid(), line);
}

void gs_refuse(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(refusal, sizeof refusal, format, args);
    va_end(args);
    gs_refusals_begin(refusal); /* before any thread can refuse: the file says why */
    gs.active = 0;
    gs.refusing = refusal;
    gs_log(1, "refusing every allocation: %s", refusal);
}
