/*
 * Reading the grant file (grant.h). Strict on purpose: anything that is not exactly a
 * well-formed version-1 grant is refused as a whole, never half-read, because the
 * library then fails closed; a lenient parse would turn damage into a wrong cap.
 */
#define _GNU_SOURCE
#include "grant.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FORMAT_LINE "gpushare-grant=1"
#define MAX_BYTES 4096
#define MAX_LINE 1024

enum key { MEM_BYTES, UUIDS, REGION, INDICES, CORE_PERCENT, KEY_COUNT };
static const char *const key_names[KEY_COUNT] = {"mem-bytes", "uuids", "region", "indices",
                                                 "core-percent"};

struct span {
    const char *text; /* NULL: the key is not in the file */
    size_t length;
};

/* Read once, under initialisation's pthread_once: static rather than on the stack of
 * whichever thread made the first CUDA call. One byte more than a grant may have (to
 * tell one that is too long), and a NUL. */
static char file[MAX_BYTES + 2];

static int malformed(char *why, size_t why_size, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
static int malformed(char *why, size_t why_size, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(why, why_size, format, args);
    va_end(args);
    return -1;
}

static int parse_decimal(const char *text, size_t length, uint64_t min, uint64_t max,
                         uint64_t *value) {
    char digits[24];
    if (length == 0 || length >= sizeof digits)
        return -1;
    for (size_t i = 0; i < length; i++)
        if (text[i] < '0' || text[i] > '9')
            return -1; /* strtoull alone takes a sign, spaces and "0x" */
    memcpy(digits, text, length);
    digits[length] = '\0';
    char *end;
    errno = 0;
    unsigned long long parsed = strtoull(digits, &end, 10);
    if (errno != 0 || end != digits + length || parsed < min || parsed > max)
        return -1;
    *value = parsed;
    return 0;
}

/* Calls `item` on each comma-separated piece of text (1 to GS_MAX_GPUS of them); the
 * count, or -1 if there are too many or `item` refuses one. */
typedef int (*item_fn)(const char *text, size_t length, unsigned index, void *into);
static int each_item(const char *text, size_t length, item_fn item, void *into) {
    unsigned count = 0;
    for (size_t at = 0;;) {
        const char *comma = memchr(text + at, ',', length - at);
        size_t piece = comma ? (size_t)(comma - text) - at : length - at;
        if (count == GS_MAX_GPUS || item(text + at, piece, count, into) != 0)
            return -1;
        count++;
        if (comma == NULL)
            return (int)count;
        at += piece + 1;
    }
}

struct numbers {
    uint64_t min, max;
    uint64_t *values;
};

static int number_item(const char *text, size_t length, unsigned index, void *into) {
    struct numbers *n = into;
    return parse_decimal(text, length, n->min, n->max, &n->values[index]);
}

int gs_parse_numbers(const char *text, size_t length, uint64_t min, uint64_t max,
                     uint64_t values[GS_MAX_GPUS]) {
    struct numbers n = {min, max, values};
    return each_item(text, length, number_item, &n);
}

static int printable(const char *text, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (text[i] <= ' ' || text[i] > '~' || text[i] == '=')
            return 0;
    return 1;
}

static int uuid_item(const char *text, size_t length, unsigned index, void *into) {
    if (index >= GS_MAX_GPUS)
        return -1;
    char(*uuids)[GS_UUID_BYTES] = into;
    if (length < 5 || length >= GS_UUID_BYTES || !printable(text, length) ||
        (strncmp(text, "GPU-", 4) != 0 && strncmp(text, "MIG-", 4) != 0))
        return -1;
    memcpy(uuids[index], text, length);
    uuids[index][length] = '\0';
    return 0;
}

int gs_parse_uuids(const char *text, size_t length, char uuids[GS_MAX_GPUS][GS_UUID_BYTES]) {
    int count = each_item(text, length, uuid_item, uuids);
    if (count < 0)
        memset(uuids, 0, GS_MAX_GPUS * sizeof uuids[0]); /* none half-read */
    return count;
}

static int key_is(const char *line, size_t key_length, const char *name) {
    return strlen(name) == key_length && memcmp(line, name, key_length) == 0;
}

/* Whether a line before `line` has the same key (the first line's included). */
static int given_before(const char *text, const char *line, size_t key_length) {
    for (const char *other = text; other < line;) {
        const char *end = strchr(other, '\n');
        const char *equals = memchr(other, '=', (size_t)(end - other));
        if (equals && (size_t)(equals - other) == key_length &&
            memcmp(other, line, key_length) == 0)
            return 1;
        other = end + 1;
    }
    return 0;
}

/* The lines: the format line, then key=value ones, each key once; the known keys'
 * values into `found`. */
static int split_lines(const char *text, size_t length, struct span found[KEY_COUNT],
                       char *why, size_t why_size) {
    if (length == 0 || text[length - 1] != '\n')
        return malformed(why, why_size, "the last line is cut short (no newline at the end)");
    for (size_t i = 0; i < length; i++)
        if (text[i] == '\0' || (unsigned char)text[i] > 0x7f)
            return malformed(why, why_size, "not ASCII text");
    const char *first_end = strchr(text, '\n');
    if ((size_t)(first_end - text) != strlen(FORMAT_LINE) ||
        memcmp(text, FORMAT_LINE, strlen(FORMAT_LINE)) != 0)
        return malformed(why, why_size, "the first line is not %s", FORMAT_LINE);
    int number = 2;
    for (const char *line = first_end + 1; line < text + length; number++) {
        const char *end = strchr(line, '\n');
        size_t line_length = (size_t)(end - line);
        const char *equals = memchr(line, '=', line_length);
        if (line_length > MAX_LINE)
            return malformed(why, why_size, "line %d is over %d bytes", number, MAX_LINE);
        if (equals == NULL)
            return malformed(why, why_size, "line %d is not key=value", number);
        size_t key_length = (size_t)(equals - line);
        if (given_before(text, line, key_length))
            return malformed(why, why_size, "%.*s is given twice", (int)key_length, line);
        for (int k = 0; k < KEY_COUNT; k++)
            if (key_is(line, key_length, key_names[k]))
                found[k] = (struct span){equals + 1, (size_t)(end - equals - 1)};
        line = end + 1;
    }
    return 0;
}

/* At most 40 characters of a value, for a log line. */
static int shown(struct span value) { return value.length < 40 ? (int)value.length : 40; }

/* A list key that must name as many GPUs as mem-bytes when it is given non-empty. */
static int same_count(struct span value, int gpus, uint64_t min, uint64_t max) {
    uint64_t ignored[GS_MAX_GPUS];
    return value.text == NULL || value.length == 0 ||
           gs_parse_numbers(value.text, value.length, min, max, ignored) == gpus;
}

static int parse(const char *text, size_t length, struct gs_grant *grant, char *why,
                 size_t why_size) {
    struct span found[KEY_COUNT] = {{0}};
    if (split_lines(text, length, found, why, why_size) != 0)
        return -1;
    struct span mem = found[MEM_BYTES], uuids = found[UUIDS], region = found[REGION];
    if (mem.text == NULL || region.text == NULL)
        return malformed(why, why_size, "%s missing", mem.text ? "region" : "mem-bytes");
    int gpus = gs_parse_numbers(mem.text, mem.length, 1, GS_MAX_CAP_BYTES,
                                grant->config.cap_bytes);
    if (gpus < 1)
        return malformed(why, why_size, "mem-bytes=%.*s is not 1 to %d caps of 1..2^50 bytes",
                         shown(mem), mem.text, GS_MAX_GPUS);
    grant->config.gpu_count = (unsigned)gpus;
    memset(grant->config.uuid, 0, sizeof grant->config.uuid);
    if (uuids.text && uuids.length &&
        gs_parse_uuids(uuids.text, uuids.length, grant->config.uuid) != gpus)
        return malformed(why, why_size, "uuids=%.*s is not %d GPU UUIDs", shown(uuids),
                         uuids.text, gpus);
    if (!same_count(found[INDICES], gpus, 0, UINT32_MAX))
        return malformed(why, why_size, "indices is not %d GPU indices", gpus);
    if (!same_count(found[CORE_PERCENT], gpus, 0, 100))
        return malformed(why, why_size, "core-percent is not %d values of 0..100", gpus);
    if (region.length == 0 || region.text[0] != '/' || !printable(region.text, region.length))
        return malformed(why, why_size, "region=%.*s is not an absolute path", shown(region),
                         region.text);
    memcpy(grant->region, region.text, region.length); /* a line: under GS_PATH_BYTES */
    grant->region[region.length] = '\0';
    return 0;
}

enum gs_grant_status gs_grant_read(struct gs_grant *grant, char *why, size_t why_size) {
    /* O_NONBLOCK: a FIFO put there must not hang every CUDA process. */
    int fd = open(GS_GRANT_PATH, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR))
        return GS_GRANT_ABSENT;
    if (fd < 0) {
        malformed(why, why_size, "cannot open it: %s", strerror(errno));
        return GS_GRANT_BAD;
    }
    size_t length = 0;
    ssize_t got;
    do {
        got = read(fd, file + length, MAX_BYTES + 1 - length);
        if (got > 0)
            length += (size_t)got;
    } while ((got > 0 || (got < 0 && errno == EINTR)) && length <= MAX_BYTES);
    int error = got < 0 ? errno : 0;
    close(fd);
    if (error != 0)
        malformed(why, why_size, "cannot read it: %s", strerror(error));
    else if (length > MAX_BYTES)
        malformed(why, why_size, "over %d bytes", MAX_BYTES);
    else {
        file[length] = '\0';
        if (parse(file, length, grant, why, why_size) == 0)
            return GS_GRANT_OK;
    }
    return GS_GRANT_BAD;
}
