/*
 * The grant: what the node decided for this container (its GPUs, their caps, where the
 * region is), written by the device plugin and mounted read-only at GS_GRANT_PATH. The
 * container can change its environment for any child; it cannot change this file, so
 * when it is there it is the only authority (docs: notes/grant-contract.md).
 */
#ifndef GPUSHARE_GRANT_H
#define GPUSHARE_GRANT_H

#include <stddef.h>
#include <stdint.h>

#include "region.h"

/* gpushare.environment's GRANT_IN_CONTAINER, or a test's path: build.py hands it over. */
#ifndef GS_GRANT_PATH
#error "build with build.defines(): the grant's path comes from gpushare.environment"
#endif

#define GS_PATH_BYTES 4096

struct gs_grant {
    struct gs_config config; /* uuid[i] "" for every GPU: mapped by ordinal */
    char region[GS_PATH_BYTES];
};

enum gs_grant_status {
    GS_GRANT_ABSENT, /* no file: not a granted container (legacy environment mode) */
    GS_GRANT_OK,
    GS_GRANT_BAD, /* there, but unreadable or malformed: `why` says what is wrong */
};

enum gs_grant_status gs_grant_read(struct gs_grant *grant, char *why, size_t why_size);

/* A comma-separated list of 1 to GS_MAX_GPUS decimal numbers in text[0..length), each
 * digits only (no sign, space or fraction) and in min..max: their count, or -1. Shared
 * with the environment's parse, so both are as strict. */
int gs_parse_numbers(const char *text, size_t length, uint64_t min, uint64_t max,
                     uint64_t values[GS_MAX_GPUS]);
/* A comma-separated list of 1 to GS_MAX_GPUS GPU or MIG UUIDs: their count, or -1 (and
 * `uuids` cleared). */
int gs_parse_uuids(const char *text, size_t length, char uuids[GS_MAX_GPUS][GS_UUID_BYTES]);

#endif
