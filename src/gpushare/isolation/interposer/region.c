/* The shared accounting region: creation, slots, the atomic check-and-reserve. */
#define _GNU_SOURCE
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hooks.h"

struct gs_region *gs_region;
static int region_fd = -1;
static char region_path[4096];
static int my_slot = -1;
/* What is enforced on each GPU: the grant's caps, or (no grant) the region's as this
 * process found them; never re-read from the region, which the container can write. */
static uint64_t cap[GS_MAX_GPUS];

static void init_header(struct gs_region *r, const struct gs_config *config) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->lock.mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    r->layout_version = GS_LAYOUT_VERSION;
    r->gpu_count = config->gpu_count;
    r->slot_count = GS_MAX_SLOTS;
    r->created_ns = gs_now_ns();
    for (unsigned i = 0; i < config->gpu_count; i++) {
        memcpy(r->gpus[i].uuid, config->uuid[i], GS_UUID_BYTES);
        r->gpus[i].cap_bytes = config->cap_bytes[i];
        /* Open until an agent says otherwise: a region no agent writes never holds. */
        r->gpus[i].gate = 1;
    }
    __atomic_store_n(&r->magic, GS_REGION_MAGIC, __ATOMIC_RELEASE);
}

/* Builds the region under a name of its own, then links it into place: whoever opens
 * `path` finds it whole, so no one ever waits for a creator. Returns the descriptor of
 * the region at `path` (another process's, if it linked first), or -1 with errno. */
static int create(const char *path, const struct gs_config *config) {
    char temp[sizeof region_path + 32];
    snprintf(temp, sizeof temp, "%s.%d.tmp", path, (int)getpid());
    unlink(temp); /* left by a creator that died with this pid */
    int fd = open(temp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    fchmod(fd, 0666); /* processes of the container may run as different users */
    struct gs_region *r = MAP_FAILED;
    if (ftruncate(fd, sizeof *r) == 0)
        r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int linked = -1;
    if (r != MAP_FAILED) {
        init_header(r, config);
        munmap(r, sizeof *r);
        linked = link(temp, path);
    }
    int error = errno;
    unlink(temp);
    if (linked == 0)
        return fd;
    close(fd);
    if (error == EEXIST)
        return open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    errno = error;
    return -1;
}

/* Whether the region at `r` can be trusted as this container's; else fails closed at
 * once, saying why (a half-made region cannot exist, so there is nothing to wait for). */
static int usable(const struct gs_region *r, const struct gs_config *config, int granted) {
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != GS_REGION_MAGIC ||
        r->layout_version != GS_LAYOUT_VERSION || r->slot_count != GS_MAX_SLOTS) {
        gs_refuse("region %s is not a layout-%u gpushare region", region_path,
                  GS_LAYOUT_VERSION);
        return 0;
    }
    if (r->gpu_count == 0 || r->gpu_count > GS_MAX_GPUS) {
        gs_refuse("region %s lists %u GPUs", region_path, r->gpu_count);
        return 0;
    }
    if (granted && r->gpu_count != config->gpu_count) {
        gs_refuse("region %s is foreign: %u GPUs, the grant's %u", region_path, r->gpu_count,
                  config->gpu_count);
        return 0;
    }
    for (unsigned i = 0; i < r->gpu_count; i++) {
        const struct gs_gpu *g = &r->gpus[i];
        /* Without a grant the region's caps are the ones enforced: 0 is no longer "none". */
        if (memchr(g->uuid, '\0', GS_UUID_BYTES) == NULL ||
            (!granted && (g->cap_bytes == 0 || g->cap_bytes > GS_MAX_CAP_BYTES))) {
            gs_refuse("region %s: the entry of GPU %u is damaged", region_path, i);
            return 0;
        }
        if (granted && strcmp(g->uuid, config->uuid[i]) != 0) {
            gs_refuse("region %s is foreign: its GPU %u is %s, the grant's %s", region_path, i,
                      g->uuid, config->uuid[i]);
            return 0;
        }
    }
    return 1;
}

static struct gs_region *map_region(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size != (off_t)sizeof(struct gs_region)) {
        gs_refuse("region %s is not a %zu-byte file, as this library's layout is", region_path,
                  sizeof(struct gs_region));
        return NULL;
    }
    struct gs_region *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        gs_refuse("cannot map region %s: %s", region_path, strerror(errno));
        return NULL;
    }
    return r;
}

static void warn_if_configured_otherwise(const struct gs_config *config) {
    if (config->gpu_count != gs_region->gpu_count) {
        gs_log(1, "region has %u GPUs, this process's environment %u: using the region's",
               gs_region->gpu_count, config->gpu_count);
        return;
    }
    for (unsigned i = 0; i < config->gpu_count; i++)
        if (config->cap_bytes[i] != gs_region->gpus[i].cap_bytes)
            gs_log(1, "GPU %u: region caps %llu bytes, this environment %llu: using the region's",
                   i, (unsigned long long)gs_region->gpus[i].cap_bytes,
                   (unsigned long long)config->cap_bytes[i]);
}

int gs_region_open(const char *path, const struct gs_config *config, int granted) {
    if (strlen(path) >= sizeof region_path) {
        gs_refuse("region path of %zu bytes is too long", strlen(path));
        return -1;
    }
    memcpy(region_path, path, strlen(path) + 1);
    /* O_NONBLOCK: a FIFO put in its place must not hang every CUDA process. */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        fd = create(path, config);
    if (fd < 0) {
        gs_refuse("cannot open region %s: %s", path, strerror(errno));
        return -1;
    }
    struct gs_region *r = map_region(fd);
    if (r == NULL || !usable(r, config, granted)) {
        if (r != NULL)
            munmap(r, sizeof *r);
        close(fd);
        return -1;
    }
    gs_region = r;
    region_fd = fd;
    for (unsigned i = 0; i < r->gpu_count; i++)
        cap[i] = granted ? config->cap_bytes[i] : r->gpus[i].cap_bytes;
    if (!granted)
        warn_if_configured_otherwise(config);
    return 0;
}

uint64_t gs_cap(int gpu) { return cap[gpu]; }

/* The byte of the file whose OFD lock says slot `s` has a live owner. */
static off_t liveness_byte(int s) { return (off_t)offsetof(struct gs_region, slots[s]); }

static int lock_byte(int fd, int s, short type, int command) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = liveness_byte(s),
                       .l_len = 1, .l_pid = 0};
    if (fcntl(fd, command, &fl) != 0)
        return -1;
    return fl.l_type;
}

static void recompute_totals(struct gs_region *r) {
    uint32_t attached = 0;
    for (unsigned g = 0; g < GS_MAX_GPUS; g++)
        r->gpus[g].used_bytes = 0;
    for (int s = 0; s < GS_MAX_SLOTS; s++) {
        if (r->slots[s].pid == 0)
            continue;
        attached++;
        for (unsigned g = 0; g < GS_MAX_GPUS; g++)
            r->gpus[g].used_bytes += r->slots[s].used[g];
    }
    r->attached = attached;
}

static void lock_region(void) {
    /* A process killed while holding it: its slot is the truth, totals are rebuilt. */
    if (pthread_mutex_lock(&gs_region->lock.mutex) == EOWNERDEAD) {
        recompute_totals(gs_region);
        pthread_mutex_consistent(&gs_region->lock.mutex);
    }
}

static void unlock_region(void) { pthread_mutex_unlock(&gs_region->lock.mutex); }

static void release_slot_locked(int s) {
    struct gs_slot *slot = &gs_region->slots[s];
    for (unsigned g = 0; g < GS_MAX_GPUS; g++) {
        uint64_t *used = &gs_region->gpus[g].used_bytes;
        *used = *used > slot->used[g] ? *used - slot->used[g] : 0;
        slot->used[g] = 0;
    }
    slot->pid = 0;
    if (gs_region->attached > 0)
        gs_region->attached--;
}

/* Slots whose owner died (no OFD lock on their byte) go back, with their bytes. */
static int reap_locked(void) {
    int reaped = 0;
    for (int s = 0; s < GS_MAX_SLOTS; s++) {
        if (s == my_slot || gs_region->slots[s].pid == 0)
            continue;
        if (lock_byte(region_fd, s, F_WRLCK, F_OFD_GETLK) == F_UNLCK) {
            gs_log(2, "reclaimed slot %d of dead pid %d", s, gs_region->slots[s].pid);
            release_slot_locked(s);
            reaped++;
        }
    }
    return reaped;
}

static int claim_slot_locked(void) {
    for (int pass = 0; pass < 2; pass++) {
        for (int s = 0; s < GS_MAX_SLOTS; s++) {
            if (gs_region->slots[s].pid != 0)
                continue;
            /* Fails only if a holder's exit is still in flight: try the next one. */
            if (lock_byte(region_fd, s, F_WRLCK, F_OFD_SETLK) < 0)
                continue;
            gs_region->slots[s].pid = getpid();
            gs_region->slots[s].attached_ns = gs_now_ns();
            gs_region->attached++;
            return s;
        }
        reap_locked();
    }
    return -1;
}

/* Whether a slot other than this process's holds memory without a live owner. Read
 * without the region's lock: reap_locked decides again under it. */
static int holds_memory_of_the_dead(void) {
    for (int s = 0; s < GS_MAX_SLOTS; s++) {
        const struct gs_slot *slot = &gs_region->slots[s];
        if (s == my_slot || __atomic_load_n(&slot->pid, __ATOMIC_RELAXED) == 0)
            continue;
        uint64_t held = 0;
        for (unsigned g = 0; g < GS_MAX_GPUS; g++)
            held |= __atomic_load_n(&slot->used[g], __ATOMIC_RELAXED);
        if (held && lock_byte(region_fd, s, F_WRLCK, F_OFD_GETLK) == F_UNLCK)
            return 1;
    }
    return 0;
}

static uint64_t reaped_at; /* CLOCK_MONOTONIC of this process's latest look */

static void reap_if_due(void) {
    uint64_t now = gs_now_ns(), last = __atomic_load_n(&reaped_at, __ATOMIC_RELAXED);
    /* One thread looks; the others show what the region says now. */
    if (now - last < GS_REAP_EVERY_NS ||
        !__atomic_compare_exchange_n(&reaped_at, &last, now, 0, __ATOMIC_RELAXED,
                                     __ATOMIC_RELAXED) ||
        !holds_memory_of_the_dead())
        return;
    lock_region();
    reap_locked();
    unlock_region();
}

struct gs_share gs_share_of(int gpu, uint64_t physical) {
    reap_if_due();
    uint64_t limit = cap[gpu]; /* what this process enforces, not the region's word */
    struct gs_share share = {
        .total = limit && limit < physical ? limit : physical,
        .used = __atomic_load_n(&gs_region->gpus[gpu].used_bytes, __ATOMIC_RELAXED),
    };
    return share;
}

int gs_region_attach(void) {
    lock_region();
    my_slot = claim_slot_locked();
    gs_region->heartbeat_ns = gs_now_ns();
    unlock_region();
    if (my_slot < 0)
        gs_refuse("all %d process slots of the region are taken", GS_MAX_SLOTS);
    return my_slot < 0 ? -1 : 0;
}

void gs_region_detach(void) {
    if (gs_region == NULL || my_slot < 0)
        return;
    lock_region();
    release_slot_locked(my_slot);
    unlock_region();
    lock_byte(region_fd, my_slot, F_UNLCK, F_OFD_SETLK);
    my_slot = -1;
}

void gs_region_forked(void) {
    /* The inherited descriptor shares the parent's open file description, hence its OFD
     * locks: the child needs a description of its own before it can hold a slot. */
    my_slot = -1;
    int fd = open(region_path, O_RDWR | O_CLOEXEC);
    if (fd >= 0) {
        close(region_fd);
        region_fd = fd;
    }
}

int gs_reserve(int gpu, uint64_t bytes) {
    if (my_slot < 0)
        return 0; /* no slot: the process fails closed (gs_region_attach said why) */
    struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t limit = cap[gpu];
    lock_region();
    int fits = g->used_bytes <= limit && bytes <= limit - g->used_bytes;
    if (!fits && reap_locked() > 0)
        fits = g->used_bytes <= limit && bytes <= limit - g->used_bytes;
    if (fits) {
        g->used_bytes += bytes;
        gs_region->slots[my_slot].used[gpu] += bytes;
    } else {
        g->allocations_refused++;
    }
    gs_region->heartbeat_ns = gs_now_ns();
    unlock_region();
    return fits;
}

void gs_unreserve(int gpu, uint64_t bytes) {
    if (my_slot < 0)
        return;
    struct gs_gpu *g = &gs_region->gpus[gpu];
    uint64_t *mine = &gs_region->slots[my_slot].used[gpu];
    lock_region();
    /* Never below zero: a slot reaped by mistake must not wrap the totals. */
    uint64_t back = bytes < *mine ? bytes : *mine;
    *mine -= back;
    g->used_bytes = g->used_bytes > back ? g->used_bytes - back : 0;
    unlock_region();
}

/* The layout as this compiler made it, for the test that the ctypes structures layout.py
 * builds from region.h match it. */
struct gs_layout_field {
    const char *name;
    uint64_t offset;
    uint64_t size;
};

#define FIELD(type, member) {#type "." #member, offsetof(struct type, member), \
                             sizeof(((struct type *)0)->member)}
static const struct gs_layout_field layout[] = {
    {"gs_region", 0, sizeof(struct gs_region)},
    FIELD(gs_region, magic), FIELD(gs_region, layout_version), FIELD(gs_region, gpu_count),
    FIELD(gs_region, slot_count), FIELD(gs_region, attached), FIELD(gs_region, created_ns),
    FIELD(gs_region, heartbeat_ns), FIELD(gs_region, lock), FIELD(gs_region, gpus),
    FIELD(gs_region, slots),
    {"gs_gpu", 0, sizeof(struct gs_gpu)},
    FIELD(gs_gpu, uuid), FIELD(gs_gpu, cap_bytes), FIELD(gs_gpu, used_bytes),
    FIELD(gs_gpu, gate), FIELD(gs_gpu, share_percent), FIELD(gs_gpu, launches),
    FIELD(gs_gpu, launches_held), FIELD(gs_gpu, held_ns), FIELD(gs_gpu, last_launch_ns), FIELD(gs_gpu, gate_until_ns),
    FIELD(gs_gpu, allocations_refused),
    {"gs_slot", 0, sizeof(struct gs_slot)},
    FIELD(gs_slot, pid), FIELD(gs_slot, reserved), FIELD(gs_slot, attached_ns),
    FIELD(gs_slot, used),
    {"pthread_mutex_t", 0, sizeof(pthread_mutex_t)},
};

EXPORT int gpushare_region_layout(const struct gs_layout_field **fields) {
    *fields = layout;
    return (int)(sizeof layout / sizeof layout[0]);
}
