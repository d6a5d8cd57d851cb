/* Internal: the executor's memory plan (see mem_plan.c).
 *
 * A run of a node list is either recorded (buffers come from the tensor
 * pool, and each one's allocation and free are timed) or planned from an
 * earlier recording of the same node list and input signature: the buffers
 * that lived and died inside the run are then cut from the running thread's
 * arena at offsets chosen so that buffers alive at the same time never
 * overlap. */
#ifndef PIPPIN_MEM_PLAN_H
#define PIPPIN_MEM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/status.h"
#include "pippin/tensor.h"

typedef struct pp_mem_plans pp_mem_plans;

pp_status pp_mem_plans_new(pp_mem_plans **out);
/* Live arena buffers keep the arena until their tensors are freed. */
void pp_mem_plans_free(pp_mem_plans *mp);

/* Starts a run of nodes[0..n_nodes) whose input signature hashes to key, on
 * the calling thread: with a plan for (nodes, key), tensor buffers allocated
 * on this thread come from the arena where the plan says; without one, the
 * run is recorded. pp_mem_run_node tells which position runs now;
 * pp_mem_run_end finishes (a recording becomes a plan; ok 0: the run
 * failed and its recording is dropped). Runs may nest (a kernel that runs
 * a graph): the inner run takes over until its end. Tensors a recorded run
 * makes must be freed on its thread, or after pp_mem_run_end (a value hook
 * that takes one keeps this rule). */
pp_status pp_mem_run_begin(pp_mem_plans *mp, const int *nodes, int n_nodes, uint64_t key);
void pp_mem_run_node(pp_mem_plans *mp, int position);
pp_status pp_mem_run_end(pp_mem_plans *mp, int ok);

/* A buffer of nbytes for tensor t, which the current run allocates on this
 * thread; sets t's free function and hint. NULL when no run is active here
 * or nothing fits (the caller then takes one from the tensor pool). */
void *pp_mem_plan_alloc(pp_tensor *t, size_t nbytes);

/* 1 if free_fn is one this file gives tensors (a recorded run's buffer,
 * an arena slot): the buffer is the tensor's own. */
int pp_mem_plan_owns(pp_free_fn free_fn);

/* Lets the calling thread's arena go (its buffers still in use keep it
 * until freed); the next planned run on this thread makes a new one. */
void pp_mem_plan_release_thread(void);

/* Bytes of the largest plan made so far (the arena's size), and the sum of
 * every buffer planned in it (what the same run would hold without reuse). */
void pp_mem_plans_peak(const pp_mem_plans *mp, int64_t *arena_bytes, int64_t *unplanned_bytes);

#endif
