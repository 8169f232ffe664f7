/*
 * What a process that fails closed leaves for the node to see: `refusing-<pid>` in the
 * container's accounting directory (the region's), saying how many allocations it refused
 * so far and why. The agent reads it back (gpushare_isolation_allocations_failed_closed);
 * the container can write the directory, so the agent trusts none of it.
 *
 * Layout: the count as 20 decimal digits, zero-padded, and a newline; the reason (at most
 * 200 bytes, newlines replaced) and a newline. Each refusal rewrites the digits with one
 * pwrite: no allocation, no lock, failures ignored (the refusal stands either way). A
 * forked child counts afresh in a file of its own, made at its first refusal.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hooks.h"

#define COUNT_DIGITS 20 /* 2^64 - 1 has 20 */
#define REASON_BYTES 200

enum file_state { NOT_YET, BEING_MADE, WRITTEN, NONE };

static char directory[4096]; /* "": not known, no file is left */
static char reason[REASON_BYTES + 1];
static int file = -1;
static int state = NOT_YET; /* of this process's file */
static uint64_t refused;    /* by this process, since it failed closed */

static void put_digits(char *out, uint64_t n) {
    for (int i = COUNT_DIGITS - 1; i >= 0; i--, n /= 10)
        out[i] = (char)('0' + n % 10);
}

/* Rewrites the count until what the file says is the latest a writer saw (a thread that
 * refused meanwhile writes it again itself). */
static void publish(void) {
    uint64_t n;
    char digits[COUNT_DIGITS];
    do {
        n = __atomic_load_n(&refused, __ATOMIC_SEQ_CST);
        put_digits(digits, n);
        if (pwrite(file, digits, sizeof digits, 0) < 0)
            return;
    } while (__atomic_load_n(&refused, __ATOMIC_SEQ_CST) != n);
}

/* Makes this process's file with the count at 0; -1 when it cannot. O_NONBLOCK: a FIFO
 * put in its place fails the open instead of hanging the process. */
static int make_file(void) {
    char path[sizeof directory + 32];
    if (snprintf(path, sizeof path, "%s/refusing-%d", directory, (int)getpid()) >=
        (int)sizeof path)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -1;
    }
    fchmod(fd, 0666); /* processes of the container may run as different users */
    char text[COUNT_DIGITS + 1 + REASON_BYTES + 1];
    size_t length = strlen(reason);
    put_digits(text, 0);
    text[COUNT_DIGITS] = '\n';
    memcpy(text + COUNT_DIGITS + 1, reason, length);
    text[COUNT_DIGITS + 1 + length] = '\n';
    if (pwrite(fd, text, COUNT_DIGITS + 2 + length, 0) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One thread makes the file; the others go on without it (its maker then writes their
 * count, gs_refusals_count). */
static enum file_state made(void) {
    int expected = NOT_YET;
    if (!__atomic_compare_exchange_n(&state, &expected, BEING_MADE, 0, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST))
        return (enum file_state)expected;
    if (directory[0] == '\0' || (file = make_file()) < 0) {
        __atomic_store_n(&state, NONE, __ATOMIC_SEQ_CST);
        return NONE;
    }
    __atomic_store_n(&state, WRITTEN, __ATOMIC_SEQ_CST);
    return WRITTEN;
}

/* The parent's file and count are not the child's. Runs alone in the new child. */
static void on_fork_child(void) {
    if (file >= 0)
        close(file);
    file = -1;
    refused = 0;
    state = NOT_YET;
}

void gs_refusals_beside(const char *region_path) {
    const char *slash = strrchr(region_path, '/');
    size_t length = slash == NULL ? 0 : slash == region_path ? 1 : (size_t)(slash - region_path);
    if (slash == NULL || length >= sizeof directory)
        return;
    memcpy(directory, region_path, length);
    directory[length] = '\0';
    pthread_atfork(NULL, NULL, on_fork_child);
}

void gs_refusals_begin(const char *why) {
    size_t length = strnlen(why, REASON_BYTES);
    for (size_t i = 0; i < length; i++)
        reason[i] = why[i] == '\n' || why[i] == '\r' ? ' ' : why[i];
    reason[length] = '\0';
    made();
}

void gs_refusals_count(void) {
    __atomic_add_fetch(&refused, 1, __ATOMIC_SEQ_CST);
    enum file_state now = (enum file_state)__atomic_load_n(&state, __ATOMIC_SEQ_CST);
    if (now == NOT_YET) /* a forked child's first refusal */
        now = made();
    if (now == WRITTEN)
        publish();
}
