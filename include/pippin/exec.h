/* Graph executor: runs a graph (or a subset of its nodes) on the CPU.
 *
 * Shapes come from the actual inputs, so every call may use another batch
 * size. Integer shape sub-graphs (values computed from constants and Shape
 * outputs only) are evaluated once per input signature and cached. Every
 * intermediate buffer is freed right after its last use.
 *
 * Thread safety: one thread runs a given pp_exec; different ones may run on different threads. */
#ifndef PIPPIN_EXEC_H
#define PIPPIN_EXEC_H

#include "pippin/export.h"

#include <stdint.h>

#include "pippin/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_exec pp_exec;

/* Resolves the graph's ops and plans buffer lifetimes. The graph must
 * outlive the executor and not gain nodes while it exists. */
PP_API pp_status pp_exec_new(pp_graph *g, pp_exec **out);
PP_API void pp_exec_free(pp_exec *ex);

/* Runs every node. inputs[i] feeds g->inputs[i] (borrowed; dtypes and
 * known dims are checked); outputs[i] receives a new reference to the value
 * of g->outputs[i]. On failure no outputs are set. */
PP_API pp_status pp_exec_run(pp_exec *ex, pp_tensor *const *inputs, pp_tensor **outputs);

/* Runs the given nodes, in order, over env (one slot per graph value).
 * Slots of parameters and constants that are NULL are filled from the graph.
 * Each node's outputs are stored in env. A value whose last reader among
 * these nodes has run is freed and its slot cleared, unless keep[v] != 0
 * (keep may be NULL: keep nothing but what no listed node reads). */
PP_API pp_status pp_exec_run_nodes(pp_exec *ex, const int *nodes, int n_nodes, pp_tensor **env,
                            const uint8_t *keep);

/* Memory plan: buffers that live and die inside one run (not the outputs,
 * not what keep holds) come from one arena per executor, at offsets planned
 * from a first, recorded run of the same node list and input signature, so
 * buffers alive at different times share memory. On by default;
 * PIPPIN_MEMORY_PLAN=0 in the environment or on = 0 here turns it off (the
 * results are the same bits either way). Lists of fewer than 8 nodes are
 * never planned. */
PP_API void pp_exec_set_memory_plan(pp_exec *ex, int on);

/* The largest plan made so far: the arena's bytes (its peak), and the sum
 * of the buffers it places (what the run holds without reuse). 0, 0 before
 * a planned run. */
PP_API void pp_exec_memory_plan(const pp_exec *ex, int64_t *plan_bytes, int64_t *buffer_bytes);

/* In-place elementwise ops (on != 0): an op whose table entry allows it
 * (Add, Sub, Mul, Div, Where, the activations and their gradients) writes
 * its output into the buffer of an input that dies at that node, when the
 * input was made earlier in the same run, has the output's dtype (float32
 * or float64) and shape (no broadcasting), is neither kept (keep), watched
 * (pp_exec_set_value_hook), a view, nor shared, and no device runs the
 * graph. The results are the same bits either way. On by default unless
 * the optimizer's "inplace" bit is off (PIPPIN_OPTIMIZE, pippin/optimize.h)
 * when the executor is made. */
PP_API void pp_exec_set_inplace(pp_exec *ex, int on);
/* Nodes that wrote their output in place, and the bytes they did not
 * allocate, since creation. */
PP_API void pp_exec_inplace_stats(const pp_exec *ex, int64_t *nodes, int64_t *bytes);

/* A function the runs that follow call after each node that produced a
 * value marked in watch (one byte per graph value, kept by the caller): it
 * may take the tensor out of *slot (setting it NULL), e.g. to add a
 * gradient into its place as soon as it exists instead of holding every
 * gradient to the end of the run. Its error stops the run. fn NULL: none.
 * A graph output it takes is NULL in pp_exec_run's outputs. */
typedef pp_status (*pp_exec_value_fn)(void *user, int value, pp_tensor **slot);
PP_API void pp_exec_set_value_hook(pp_exec *ex, const uint8_t *watch, pp_exec_value_fn fn, void *user);

/* With a value hook set: a function asked, before a node that makes a
 * watched value runs, for a tensor the node may add that value into
 * instead of making it (the gradient's place in a flat buffer, whose
 * elements then equal target + value). It sets *target (a new reference
 * of the value's dtype and element count) or leaves it NULL. A kernel that
 * can (a weight's gradient as one tall GEMM, with beta 1; a bias's
 * gradient (SumToShape), LayerNorm's weight and bias gradients and an
 * embedding's (GatherGrad), whose sums are added there) accumulates into
 * it and makes no tensor, and the value hook is not called for it: no
 * temporary gradient, no separate pass adding it. fn NULL: none. */
typedef pp_status (*pp_exec_target_fn)(void *user, int value, pp_tensor **target);
PP_API void pp_exec_set_target_hook(pp_exec *ex, pp_exec_target_fn fn);

/* Kernels run and nodes answered from the shape cache since creation. */
PP_API void pp_exec_stats(const pp_exec *ex, int64_t *kernels_run, int64_t *nodes_cached);

/* Declares (on != 0) that the graph's parameters will not change from now
 * on, as in inference: what is computed from parameters and constants alone
 * (a transposed weight, a folded constant) is then computed once and kept
 * for every input shape. Off again before changing a parameter. */
PP_API void pp_exec_set_constant_params(pp_exec *ex, int on);

/* The host wrote the data of the graph's parameters or constants in place
 * (a model's weights replaced on a running service): what was computed
 * from them (the constant cache above) and their copies on the executor's
 * device (kept across runs, found by the tensor, which an in-place write
 * does not change) are made again at the next run. Not during a run. */
PP_API void pp_exec_constants_written(pp_exec *ex);
/* Packed weights for training (on != 0): a GEMM by a 2-D float32
 * parameter (pippin::MatMulAdd, a Linear layer's forward) at a size where
 * a prepared copy of the weight beats OpenBLAS packing it on every call
 * reads a copy made at its first use and reused by every later run, until
 * pp_exec_params_changed: panels for pippin's packed GEMM at up to 256
 * rows, W^T for OpenBLAS (its cheaper packing path) at up to 512. Call that after writing any parameter (or
 * replacing its tensor) and before the next run: the executor cannot see
 * writes to parameter memory. Stages and the whole-model trainer turn it
 * on in training when the optimizer's "pack" bit is on (pippin/optimize.h)
 * and call pp_exec_params_changed wherever their parameters may change.
 * Off by default; turning it off frees the copies, on again starts afresh.
 * Results match the unpacked run's within float rounding (another order
 * of sums), and the same bits at any thread count. With
 * PIPPIN_PACK_CHECK=1 every reuse is checked against a fresh pack and a
 * stale copy fails the node (a debugging aid: it costs a pack per use).
 * Errors: out of memory. */
PP_API pp_status pp_exec_set_pack_weights(pp_exec *ex, int on);
PP_API int pp_exec_pack_weights(const pp_exec *ex);
/* Every packed copy is stale from now on (packed again at its next use). */
PP_API void pp_exec_params_changed(pp_exec *ex);
/* Weights packed, and packed copies reused, since packing was turned on. */
PP_API void pp_exec_pack_stats(const pp_exec *ex, int64_t *packed, int64_t *reused);

/* The stream random ops draw from in the runs that follow: training-mode
 * Dropout's mask is a function of (seed, step, microbatch, node name,
 * element) alone (Philox4x32-10), so the same step and microbatch give the
 * same mask on any rank, in any order. Default: all 0. */
PP_API void pp_exec_set_random_stream(pp_exec *ex, uint64_t seed, int64_t step, int64_t microbatch);

/* Runs one node on the given inputs (for tests and tools). */
PP_API pp_status pp_exec_node(const pp_graph *g, int node, pp_tensor *const *inputs,
                       pp_tensor **outputs);

/* One-shot convenience: pp_exec_new + pp_exec_run + pp_exec_free. */
PP_API pp_status pp_graph_run(pp_graph *g, pp_tensor *const *inputs, pp_tensor **outputs);

/* Sets the BLAS library's own thread count (OpenBLAS); 0 when the BLAS
 * pippin was linked with has no such setting (a generic CBLAS) or n < 1,
 * 1 when set. pippin keeps it at 1 (its first GEMM and pp_set_threads set
 * it): GEMMs are cut into panels over pippin's pool instead, whose threads
 * sleep between calls where OpenBLAS's spin. A count above 1 nests the
 * BLAS's threads inside the pool's panels; rarely useful. */
PP_API int pp_set_blas_threads(int n);

/* Threads. pippin runs its GEMMs (in panels, each an OpenBLAS call on one
 * thread) and its row-parallel kernels (softmax, layernorm, elementwise
 * ops, reductions, copies, optimizer updates) on one thread pool per
 * process; results are the same bits at any thread count.
 *
 * pp_set_threads sets the pool to n threads (the calling thread counts as one)
 * and returns the count in effect; n < 1: the default. Call it from one
 * thread while no graph runs (it waits for a parallel loop in flight).
 * Ranks that are threads of one process share the pool: a kernel that finds
 * it busy runs on its own thread.
 *
 * pp_default_threads: PIPPIN_THREADS when set, else the CPUs this process
 * may use (sched_getaffinity) divided by ranks_on_host, at least 1. Without
 * pp_set_threads the pool takes pp_default_threads(1).
 * pp_get_threads: the pool's size now. */
PP_API int pp_set_threads(int n);
PP_API int pp_default_threads(int ranks_on_host);

/* The most memory one thread keeps for GEMM operands between calls (B^T
 * panels, a packed block of A^T; freed when the thread ends, the main
 * thread's at exit), outside any memory plan; 0 where the BLAS runs every
 * product (no AVX-512 on this machine: what a training host will keep
 * depends on its CPU). Every pool and rank thread that multiplies may keep
 * this much. */
PP_API size_t pp_gemm_scratch_bytes(void);

/* glibc's malloc tuned for a rank (nothing elsewhere): the mmap threshold
 * fixed at 128 KiB (freed large blocks leave RSS) and the heap's top kept
 * up to 4 MiB (the transport's receive buffers reuse pages instead of
 * faulting in new ones: small tensors over tcp 1.4x). Process-wide, so
 * the library never does it on its own: the pippin CLI calls it first
 * thing; a service embedding pippin may. MALLOC_MMAP_THRESHOLD_ and
 * MALLOC_TRIM_THRESHOLD_ in the environment win. */
PP_API void pp_tune_allocator(void);
PP_API int pp_get_threads(void);

/* Cores lent between the ranks of one host (lib/core_share.c). A rank
 * that waits for its peers lends its own threads; a rank that computes
 * borrows what is lent, one parallel kernel at a time, so a pipeline with
 * one request in flight (or in a schedule's bubble) computes on the cores
 * of the ranks that wait for it. Results are the same bits either way.
 *
 * pp_share_cores_join: this process is rank `slot` of `n_slots` ranks that
 * meet under `key` (the same string in each: pippin's workers use their
 * config's rank endpoints); it computes on own_threads of its own and up to
 * cap in all (the pool's size becomes cap). Returns an error (and shares
 * nothing) when the shared-memory segment cannot be made. One join per
 * process; joining again leaves first.
 * pp_share_cores_leave: stops sharing; the pool goes back to own_threads.
 * pp_share_cores_idle(1): this rank waits and lends its threads; (0): it
 * computes again (the transport's blocking waits call it). No-op when not
 * joined.
 * pp_share_cores_joined: 1 while joined.
 * pp_share_cores_borrowed_calls: parallel calls since the process started
 * that ran on borrowed threads (for tests). */
PP_API pp_status pp_share_cores_join(const char *key, int slot, int n_slots, int own_threads, int cap);
PP_API void pp_share_cores_leave(void);
PP_API void pp_share_cores_idle(int idle);
PP_API int pp_share_cores_joined(void);
/* 1 while another rank of the host computes on threads lent to it (a
 * rank that busy-polls while it lends stops, so the borrowed thread gets
 * the core it spins on). */
PP_API int pp_share_cores_borrowing(void);
/* Claims on the host that took lent threads, ever (0 when not joined). */
PP_API int64_t pp_share_cores_borrows(void);
PP_API int64_t pp_share_cores_borrowed_calls(void);

#ifdef __cplusplus
}
#endif
#endif
