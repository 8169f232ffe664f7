/*
 * The table of what this process holds: each pointer, handle, array and mapping with its
 * bytes and GPU, so that its free gives back exactly that. An open-addressing table
 * (linear probing, backward-shift deletion) that doubles at 3/4 full, so that a free
 * costs the same at a million live allocations as at ten.
 */
#include <stdlib.h>

#include "memory.h"
#include "region.h"

pthread_mutex_t gs_held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_held *table;
static unsigned table_bits;
static size_t table_count;

static size_t home_of(uint8_t kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 59)) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> (64 - table_bits));
}

struct gs_held *gs_held_find(enum gs_kind kind, uint64_t key) {
    if (table == NULL)
        return NULL;
    size_t mask = ((size_t)1 << table_bits) - 1;
    for (size_t i = home_of((uint8_t)kind, key); table[i].kind != GS_EMPTY; i = (i + 1) & mask)
        if (table[i].key == key && table[i].kind == kind)
            return &table[i];
    return NULL;
}

static void held_place(const struct gs_held *h) {
    size_t mask = ((size_t)1 << table_bits) - 1, i = home_of(h->kind, h->key);
    while (table[i].kind != GS_EMPTY)
        i = (i + 1) & mask;
    table[i] = *h;
}

int gs_held_insert(const struct gs_held *h) {
    if (table == NULL || (table_count + 1) * 4 > ((size_t)3 << table_bits)) {
        struct gs_held *old = table;
        size_t old_size = old ? (size_t)1 << table_bits : 0;
        unsigned bits = old ? table_bits + 1 : 12;
        struct gs_held *grown = calloc((size_t)1 << bits, sizeof *grown);
        if (grown == NULL)
            return -1;
        table = grown, table_bits = bits;
        for (size_t i = 0; i < old_size; i++)
            if (old[i].kind != GS_EMPTY)
                held_place(&old[i]);
        free(old);
    }
    held_place(h);
    table_count++;
    return 0;
}

void gs_held_erase(struct gs_held *h) {
    size_t mask = ((size_t)1 << table_bits) - 1, hole = (size_t)(h - table);
    table[hole].kind = GS_EMPTY;
    for (size_t j = (hole + 1) & mask; table[j].kind != GS_EMPTY; j = (j + 1) & mask) {
        size_t home = home_of(table[j].kind, table[j].key);
        /* It moves into the hole unless its home lies cyclically in (hole, j]. */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            table[hole] = table[j];
            table[j].kind = GS_EMPTY;
            hole = j;
        }
    }
    table_count--;
}

void gs_remember(enum gs_kind kind, uint64_t key, int gpu, uint64_t bytes) {
    struct gs_held h = {key, bytes, 0, kind == GS_HANDLE, 0, (uint8_t)kind, (int8_t)gpu};
    pthread_mutex_lock(&gs_held_lock);
    int kept = gs_held_insert(&h);
    pthread_mutex_unlock(&gs_held_lock);
    if (kept != 0)
        gs_unreserve(gpu, bytes); /* cannot track it: better uncounted than never freed */
}

void gs_held_forked(void) {
    /* The child holds none of its parent's allocations (contexts do not survive fork). */
    free(table);
    table = NULL, table_bits = 0, table_count = 0;
    pthread_mutex_init(&gs_held_lock, NULL);
}
