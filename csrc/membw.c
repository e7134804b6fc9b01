/*
 * membw.c — measured memory read bandwidth, for `llmrt bench`'s bandwidth bound.
 *
 * n_threads threads each stream-read their share of one buffer (64-bit loads into eight
 * independent xor accumulators, so the loop is limited by memory, not by a dependency chain),
 * `reps` times; the best repetition is reported. The buffer is written first so every page is
 * backed by real memory (not the shared zero page).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmrt/llmrt.h"

typedef struct {
    const uint64_t *p;
    size_t n;         /* uint64 words */
    uint64_t sink;
} membw_part;

static void *membw_read(void *arg) {
    membw_part *a = (membw_part *)arg;
    uint64_t s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= a->n; i += 8) {
        for (int k = 0; k < 8; k++) s[k] ^= a->p[i + (size_t)k];
    }
    for (; i < a->n; i++) s[0] ^= a->p[i];
    a->sink = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

double llmrt_read_bandwidth(size_t bytes, int n_threads, int reps) {
    if (n_threads < 1 || n_threads > 256 || reps < 1 || bytes < 4096) return -1.0;
    const size_t words = bytes / sizeof(uint64_t);
    uint64_t *buf = (uint64_t *)malloc(words * sizeof(uint64_t));
    membw_part *parts = (membw_part *)calloc((size_t)n_threads, sizeof(membw_part));
    pthread_t *th = (pthread_t *)calloc((size_t)n_threads, sizeof(pthread_t));
    double best = -1.0;
    if (buf == NULL || parts == NULL || th == NULL) goto done;
    for (size_t i = 0; i < words; i++) buf[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    const size_t per = words / (size_t)n_threads;
    for (int r = 0; r < reps; r++) {
        int started = 0;
        const double t0 = now_s();
        for (int t = 0; t < n_threads; t++) {
            parts[t].p = buf + (size_t)t * per;
            parts[t].n = t == n_threads - 1 ? words - (size_t)t * per : per;
            if (t == 0) continue;
            if (pthread_create(&th[t], NULL, membw_read, &parts[t]) != 0) break;
            started = t;
        }
        membw_read(&parts[0]);
        for (int t = 1; t <= started; t++) pthread_join(th[t], NULL);
        const double dt = now_s() - t0;
        if (started != n_threads - 1) goto done;   /* could not start every thread */
        const double bw = (double)(words * sizeof(uint64_t)) / dt;
        if (bw > best) best = bw;
    }
done:
    free(th);
    free(parts);
    free(buf);
    return best;
}
