/*
 * threadpool.c — a pthread pool started once: n_threads - 1 workers plus the calling thread.
 *
 * A run publishes (fn, arg) under the mutex, bumps `generation` and wakes the workers; each calls
 * fn(arg, ith, nth) and reports back; the caller runs ith = 0 itself and waits for the others.
 * Both waits spin for a short while (SPIN_NS) before sleeping on their condition variable: token
 * by token decoding starts a run every few milliseconds, and a futex wake-up per run and thread
 * costs more than the spinning (150 us per run, measured, on a 2-core VM).
 * The barrier used between graph nodes is a sense-counting spin barrier on two atomics that
 * falls back to sched_yield(), so it behaves when there are fewer free cores than threads.
 * In a child process after fork() the workers do not exist; runs there use the caller alone.
 */
#include "llmrt/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define WORKER_STACK_BYTES ((size_t)8 << 20) /* each worker's stack (glibc's usual default) */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_NS 2000000L /* how long a wait spins before it sleeps: 2 ms */

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

typedef struct {
    llmrt_threadpool *tp;
    int ith;
    pthread_t thread;
} worker;

struct llmrt_threadpool {
    int n_threads;
    int n_active;               /* threads taking part in the current run */
    pid_t pid;                  /* the process that started the workers */
    worker *workers;            /* [n_threads - 1], thread ith = index + 1 */
    int n_started;              /* workers actually created */

    pthread_mutex_t run_lock;   /* serializes runs */
    pthread_mutex_t mutex;      /* guards the fields below */
    pthread_cond_t cond_start;  /* workers wait for a new generation */
    pthread_cond_t cond_done;   /* the caller waits for n_done == n_threads - 1 */
    atomic_uint generation;     /* bumped (under the mutex) by each run */
    atomic_int n_done;          /* workers finished with the current run */
    atomic_int stop;
    llmrt_task_fn fn;
    void *arg;

    atomic_int barrier_count;   /* threads arrived at the current barrier */
    atomic_uint barrier_gen;    /* bumped when everyone has arrived */
};

/* One step of a bounded spin: pause for the first SPIN_PAUSES steps, then yield the core (to a
 * thread we may be waiting for, when there are more runnable threads than cores). Returns 0 once
 * SPIN_NS have passed since t_start (checked every 64 steps). */
#define SPIN_PAUSES 2000
static int spin_step(int i, long long t_start) {
    if (i < SPIN_PAUSES) {
        cpu_relax();
    } else {
        sched_yield();
    }
    return (i & 63) != 0 || now_ns() - t_start < SPIN_NS;
}

/* Spins until *v != old (a uint) or stop, for at most SPIN_NS. */
static void spin_while_equal(const atomic_uint *v, unsigned old, const atomic_int *stop) {
    const long long t0 = now_ns();
    for (int i = 1; atomic_load(v) == old && !atomic_load(stop); i++) {
        if (!spin_step(i, t0)) return;
    }
}

static void *worker_main(void *p) {
    worker *w = (worker *)p;
    llmrt_threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        spin_while_equal(&tp->generation, seen, &tp->stop);
        pthread_mutex_lock(&tp->mutex);
        while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop)) {
            pthread_cond_wait(&tp->cond_start, &tp->mutex);
        }
        if (atomic_load(&tp->stop)) {
            pthread_mutex_unlock(&tp->mutex);
            break;
        }
        seen = atomic_load(&tp->generation);
        llmrt_task_fn fn = tp->fn;
        void *arg = tp->arg;
        const int nth = tp->n_active;
        pthread_mutex_unlock(&tp->mutex);

        fn(arg, w->ith, nth);

        /* The last worker to finish signals under the mutex: the caller checks the count under
         * it before sleeping, so the signal cannot fall between its check and its wait. */
        if (atomic_fetch_add(&tp->n_done, 1) + 1 == nth - 1) {
            pthread_mutex_lock(&tp->mutex);
            pthread_cond_signal(&tp->cond_done);
            pthread_mutex_unlock(&tp->mutex);
        }
    }
    return NULL;
}

llmrt_threadpool *llmrt_threadpool_new(int n_threads) {
    if (n_threads < 1) return NULL;
    llmrt_threadpool *tp = (llmrt_threadpool *)calloc(1, sizeof(*tp));
    if (tp == NULL) return NULL;
    tp->n_threads = n_threads;
    tp->n_active = n_threads;
    tp->pid = getpid();
    pthread_mutex_init(&tp->run_lock, NULL);
    pthread_mutex_init(&tp->mutex, NULL);
    pthread_cond_init(&tp->cond_start, NULL);
    pthread_cond_init(&tp->cond_done, NULL);
    atomic_init(&tp->generation, 0u);
    atomic_init(&tp->n_done, 0);
    atomic_init(&tp->stop, 0);
    atomic_init(&tp->barrier_count, 0);
    atomic_init(&tp->barrier_gen, 0u);
    if (n_threads > 1) {
        tp->workers = (worker *)calloc((size_t)(n_threads - 1), sizeof(worker));
        if (tp->workers == NULL) {
            llmrt_threadpool_free(tp);
            return NULL;
        }
        /* an explicit stack size: some kernels keep their tiles' staging on the stack (the avx2
         * Q4_0 prefill frame is ~190 KB), more than some C libraries' default (musl: 128 KB) */
        pthread_attr_t attr;
        const int have_attr = pthread_attr_init(&attr) == 0;
        if (have_attr) (void)pthread_attr_setstacksize(&attr, WORKER_STACK_BYTES);
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, have_attr ? &attr : NULL, worker_main, &tp->workers[i]) != 0) {
                if (have_attr) pthread_attr_destroy(&attr);
                llmrt_threadpool_free(tp);
                return NULL;
            }
            tp->n_started++;
        }
        if (have_attr) pthread_attr_destroy(&attr);
    }
    return tp;
}

void llmrt_threadpool_free(llmrt_threadpool *tp) {
    if (tp == NULL) return;
    pthread_mutex_lock(&tp->mutex);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->cond_start);
    pthread_mutex_unlock(&tp->mutex);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    free(tp->workers);
    pthread_cond_destroy(&tp->cond_done);
    pthread_cond_destroy(&tp->cond_start);
    pthread_mutex_destroy(&tp->mutex);
    pthread_mutex_destroy(&tp->run_lock);
    free(tp);
}

int llmrt_threadpool_n_threads(const llmrt_threadpool *tp) {
    return tp->n_threads;
}

void llmrt_threadpool_run(llmrt_threadpool *tp, llmrt_task_fn fn, void *arg) {
    pthread_mutex_lock(&tp->run_lock);
    /* After fork() only the calling thread exists in the child: run everything on it. */
    const int nth = getpid() == tp->pid ? tp->n_threads : 1;
    tp->n_active = nth;
    if (nth > 1) {
        pthread_mutex_lock(&tp->mutex);
        tp->fn = fn;
        tp->arg = arg;
        atomic_store(&tp->n_done, 0);
        atomic_fetch_add(&tp->generation, 1u);   /* spinning workers see this, sleeping ones wake: */
        pthread_cond_broadcast(&tp->cond_start);
        pthread_mutex_unlock(&tp->mutex);
    }
    fn(arg, 0, nth);
    if (nth > 1) {
        const long long t0 = now_ns();
        for (int i = 1; atomic_load(&tp->n_done) < nth - 1; i++) {
            if (!spin_step(i, t0)) break;
        }
        pthread_mutex_lock(&tp->mutex);
        while (atomic_load(&tp->n_done) < nth - 1) pthread_cond_wait(&tp->cond_done, &tp->mutex);
        pthread_mutex_unlock(&tp->mutex);
    }
    pthread_mutex_unlock(&tp->run_lock);
}

void llmrt_threadpool_barrier(llmrt_threadpool *tp) {
    const int nth = tp->n_active;
    if (nth == 1) return;
    /* Read the generation before arriving: the last arrival bumps it, releasing the others. */
    const unsigned gen = atomic_load(&tp->barrier_gen);
    if (atomic_fetch_add(&tp->barrier_count, 1) == nth - 1) {
        atomic_store(&tp->barrier_count, 0);
        atomic_fetch_add(&tp->barrier_gen, 1u);
        return;
    }
    int spins = 0;
    while (atomic_load(&tp->barrier_gen) == gen) {
        if (++spins < 2000) {
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}
