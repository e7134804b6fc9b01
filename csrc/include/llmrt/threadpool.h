/*
 * threadpool.h — one pool of worker threads, started once and reused for every graph run.
 *
 * How to use it:
 *   llmrt_threadpool *tp = llmrt_threadpool_new(n_threads);    // n_threads - 1 workers start
 *   llmrt_threadpool_run(tp, fn, arg);   // fn(arg, ith, nth) on every thread, the caller's thread
 *                                        // being ith = 0; returns when all have returned
 *   llmrt_threadpool_free(tp);
 *
 * Inside fn, threads meet with llmrt_threadpool_barrier(tp) (between graph nodes). Work inside a
 * node is shared by claiming chunks with an atomic counter (see csrc/ops/ops.h), not by a fixed
 * split, so a thread that was descheduled does not hold everyone up.
 *
 * Runs on one pool are serialized by a lock (llmrt_threadpool_run takes it), so several graphs
 * may share a pool. In a child process after fork() the workers are gone: runs there have one
 * thread (nth = 1) and still complete. Between runs the workers sleep on a condition variable; inside a run the
 * barrier spins briefly, then yields the CPU (the machine may be oversubscribed).
 */
#ifndef LLMRT_THREADPOOL_H
#define LLMRT_THREADPOOL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct llmrt_threadpool llmrt_threadpool;

/* fn(arg, ith, nth): ith in [0, nth). */
typedef void (*llmrt_task_fn)(void *arg, int ith, int nth);

/* NULL if n_threads < 1 or threads could not be created. */
llmrt_threadpool *llmrt_threadpool_new(int n_threads);
void llmrt_threadpool_free(llmrt_threadpool *tp);
int llmrt_threadpool_n_threads(const llmrt_threadpool *tp);

/* Runs fn on all n_threads threads (the caller is thread 0) and waits for all. */
void llmrt_threadpool_run(llmrt_threadpool *tp, llmrt_task_fn fn, void *arg);

/* Waits until all n_threads threads of the current run have reached it. Only valid inside fn. */
void llmrt_threadpool_barrier(llmrt_threadpool *tp);

#ifdef __cplusplus
}
#endif

#endif /* LLMRT_THREADPOOL_H */
