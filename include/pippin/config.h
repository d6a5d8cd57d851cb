/* Pipeline configuration files (YAML): one file describes a whole pipeline
 * and every rank's worker reads the same file (docs/config.md).
 *
 *   model: examples/gpt/model.onnx        # relative paths: to the file's directory
 *   stages: split/                         # instead of model: `pippin split` output (pipe.json);
 *                                          #   each worker then loads only its own stage files
 *   split:                                 # optional; markers in the model also cut
 *     before: ["/blocks.2/"]
 *     after: []
 *     transmit_shared: false
 *     # auto: 4                            # instead of before/after: 4 balanced stages
 *     # memory_cap: 2000000000             #   bytes per stage (parameters + 1F1B stash)
 *     # marker_identity: "*pipe_split*"    # Identity nodes with these names are markers too
 *   dims: {seq: 64}                        # sizes of dynamic dims, for shape probing
 *   mode: train                            # train | infer | serve
 *   schedule: 1f1b                         # any `pippin schedule` kind, or csv:FILE
 *   microbatches: 4
 *   batch_size: 16
 *   steps: 100
 *   loss: loss                             # optional: which output is the loss
 *   optimizer: {kind: adamw, lr: 0.003, weight_decay: 0.01, betas: [0.9, 0.999], eps: 1.0e-8,
 *               momentum: 0.0, dampening: 0.0, nesterov: false}
 *   data: {idx: data/idx.npy, targets: data/targets.npy}   # model input -> .npy (rows along dim 0)
 *   text: {file: data/tiny.txt, vocab: vocab.json, seq: 64} # instead of data (char-level models)
 *   ranks:                                 # one endpoint per rank
 *     - tcp://10.0.0.1:5555
 *     - tcp://10.0.0.2:5555
 *   bind: tcp://0.0.0.0:5555               # optional: what each worker binds instead of its endpoint
 *   timeout_ms: 10000
 *   shared_memory: true                    # ranks on one host skip the socket (docs/transport.md)
 *   bulk_lanes: true                       # large tensors between hosts on TCP lanes of their own
 *   security:                              # optional CURVE; key files from `pippin keygen`
 *     secret_keys: [keys/rank0.key, keys/rank1.key]   # rank r reads only entry r
 *     public_keys: [keys/rank0.pub, keys/rank1.pub]
 *   output_dir: out/                       # trained parameters (train) or outputs (infer)
 *   checkpoint: {dir: ckpt/, every: 10, keep: 2}  # mode train: committed checkpoints
 *                                          #   every N steps (0: after the last only), K newest kept
 *   run_id: gpt-small-01                   # optional: this run's identity (default: random)
 *   insecure: false                        # true: allow non-loopback tcp without security:
 *   rejoin_timeout_ms: 60000               # optional: wait for a failed rank to come back
 *   replicas: 2                            # optional (mode train): data-parallel copies of the pipeline;
 *                                          #   ranks lists replicas x the schedule's ranks
 *   gradient_buckets: {first_bytes: 1048576, bytes: 26214400, direct_links: true}  # the replicas' gradient sums
 *   shard_optimizer: true                  # optional, with replicas: ZeRO-1 (optimizer state / replicas)
 *   wire_dtype: bfloat16                   # optional: activations and gradients between ranks (float32)
 *   device: cuda:0                         # optional: cpu (default), cuda:N, or a list per rank;
 *                                          #   stage_devices: [cuda:0, cpu] per stage
 *   threads: 2                             # optional: compute threads per rank (default: the CPUs
 *                                          #   divided among the ranks on the host)
 *   share_cores: false                     # optional: ranks on one host lend their threads to a busy
 *                                          #   one while they wait (default true; pp_share_cores_join)
 *   spin_us: 300                           # optional: a waiting rank busy-polls this long before it
 *                                          #   sleeps (default: 2000 serving with a core per rank, else 0)
 *   recompute: [0, 2]                      # optional (mode train): stages that recompute their forward
 *                                          #   before the backward instead of stashing (true: all)
 *   serve: {endpoint: tcp://127.0.0.1:5600, max_batch: 8, max_wait_us: 500,   # mode serve
 *           max_queue: 256, max_inflight: 0, max_request_bytes: 67108864,
 *           client_keys: [keys/client.pub]}   # with security: only: the clients the front admits (CURVE)
 *
 * Without `security:`, a tcp endpoint in ranks or bind that is not loopback
 * (127.0.0.0/8, ::1, localhost; wildcards 0.0.0.0, * and :: are not) is
 * refused unless `insecure: true`, as is any other network transport; ipc://
 * and inproc:// are always fine.
 *
 * The file is at most 1 MiB and YAML nests at most 32 levels deep.
 *
 * Unknown keys, wrong types and bad values are errors naming the file, the
 * line and the key.
 *
 * Thread safety: reentrant; a parsed config is read-only and may be shared. */
#ifndef PIPPIN_CONFIG_H
#define PIPPIN_CONFIG_H

#include "pippin/export.h"

#include <stddef.h>
#include <stdint.h>

#include "pippin/optim.h"
#include "pippin/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pp_config_entry {
    char *key;
    char *value;
} pp_config_entry;

typedef struct pp_config {
    char *path;          /* the file read */
    char *model;         /* resolved against the file's directory; NULL when stages is given */
    char *stages;        /* a `pippin split` directory: each worker loads only its stage files */
    int n_split_before, n_split_after;
    char **split_before, **split_after;
    int transmit_shared;
    int split_auto;          /* split.auto: balanced stages, their count (0: off) */
    int64_t split_memory_cap; /* split.memory_cap: bytes per stage for split.auto (0: none) */
    int n_freeze;
    char **freeze;           /* parameter name patterns to freeze (fnmatch) */
    int n_dims;
    pp_config_entry *dims;   /* value: a decimal size ("64") */
    int training;            /* mode: train (1) or infer (0); default train */
    char *schedule;          /* default "gpipe" (csv: paths resolved) */
    int microbatches;        /* default 1 */
    int64_t batch_size;      /* required */
    int64_t steps;           /* default 1 */
    char *loss;              /* NULL: automatic */
    pp_optim_config optim;   /* default: AdamW with torch's defaults */
    int n_data;
    pp_config_entry *data;   /* input name -> .npy path (resolved) */
    char *text_file, *text_vocab;  /* resolved; NULL unless text: given */
    int text_seq;            /* 0: the model's */
    int n_ranks;
    char **ranks;            /* endpoints */
    char *bind;              /* NULL: each rank binds its endpoint */
    int timeout_ms;          /* default 10000 */
    int shared_memory;       /* same-host ranks use shared-memory rings; default 1 */
    int bulk_lanes;          /* large tensors between hosts on bulk lanes; default 1 */
    int n_secret_keys, n_public_keys;
    char **secret_keys, **public_keys; /* key file paths (resolved) */
    char *output_dir;        /* NULL: none (resolved) */
    char *checkpoint_dir;    /* checkpoint.dir (resolved); NULL: no checkpoints */
    int64_t checkpoint_every; /* checkpoint.every: steps between checkpoints; default 0: after the last only */
    int checkpoint_keep;     /* checkpoint.keep: committed checkpoints kept, >= 1; default 2 */
    char *run_id;            /* NULL: none given */
    int insecure;            /* allow unencrypted non-loopback endpoints; default 0 */
    int rejoin_timeout_ms;   /* > 0: survivors of a peer's failure wait this long for it to rejoin
                              * (pippin/worker.h); default 0: a failure ends the run */
    /* mode: serve (docs/serving.md): the serve: section */
    int serving;
    char *serve_endpoint;    /* serve.endpoint: the front's ROUTER (tcp:// or ipc://) */
    int serve_max_batch;     /* serve.max_batch: rows merged into one batch; default 8 */
    int serve_max_wait_us;   /* serve.max_wait_us: how long a batch waits to fill; default 500 */
    int serve_max_queue;     /* serve.max_queue: requests waiting or running; past it "busy"; default 256 */
    int serve_max_inflight;  /* serve.max_inflight: batches in the pipeline at once; default ranks + 1 */
    int64_t serve_max_request_bytes; /* serve.max_request_bytes: default 64 MiB */
    int serve_max_sessions;          /* serve.max_sessions: open sessions; default 64 */
    int serve_session_idle_ms;       /* serve.session_idle_ms: a session unused this long is dropped; default 10 min */
    int64_t serve_session_max_bytes; /* serve.session_max_bytes: state one rank keeps; default 1 GiB */
    int n_serve_state;
    pp_config_entry *serve_state;    /* serve.state: output -> input it feeds next time; none: present.X -> past_key_values.X */
    char *serve_vocab;               /* serve.vocab: vocab.json for text prompts (resolved); NULL: tokens only */
    int serve_context;               /* serve.context: tokens a stateless model sees when generating; 0: all */
    int n_serve_client_keys;
    char **serve_client_keys;        /* serve.client_keys: public key files (resolved) of the clients the front
                                      * admits; required with security:, refused without it */
    char *params;                    /* params: a directory of <name>.npy that replace the model's initializers */
    int serve_max_tokens;            /* serve.max_tokens: most tokens one generation may ask for; default 4096 */
    int recompute;                   /* recompute: true: every stage recomputes its forward before its
                                      * backward-input (pp_stage_set_recompute); default 0 */
    int n_recompute_stages;
    int *recompute_stages;           /* recompute: [0, 2]: these stages only (checked against the pipe when
                                      * a worker opens it) */
    int recompute_line;              /* the line of the recompute key, for those messages */
    int *recompute_lines;            /* per entry of recompute_stages: its own line */
    /* replicas: R data-parallel copies of the pipeline (mode train): ranks
     * lists R times the schedule's ranks, replica k's being k*P .. k*P+P-1;
     * each replica reads batch_size/R rows of every batch and the replicas
     * sum their gradients (pippin/executor.h, pp_executor_set_replicas).
     * Default 1. */
    int replicas;
    int64_t bucket_first_bytes;      /* gradient_buckets.first_bytes: default 1 MiB */
    int64_t bucket_bytes;            /* gradient_buckets.bytes: default 25 MiB */
    int bucket_direct_links;         /* gradient_buckets.direct_links: default 1 */
    int shard_optimizer;             /* shard_optimizer: ZeRO-1 over the replicas; default 0 */
    int wire_bf16;                   /* wire_dtype: bfloat16: float32 activations and gradients between
                                      * ranks travel as bfloat16 (pp_executor_set_wire_dtype); default 0 */
    char *split_marker_identity;     /* split.marker_identity: Identity nodes whose name matches (fnmatch)
                                      * are stage markers (pp_graph_identity_markers); NULL: none */
    int threads;                     /* threads: each rank's compute threads (pippin's pool and the BLAS);
                                      * 0 (default): the CPUs the worker may use divided among the
                                      * ranks on its host (pp_worker_threads) */
    int share_cores;                 /* share_cores: same-host ranks lend their threads to a busy one while
                                      * they wait (pp_share_cores_join); default 1 */
    int spin_us;                     /* spin_us: a rank waiting for a peer busy-polls this long before it
                                      * sleeps (pp_transport_options.spin_us); -1 (default): auto
                                      * (pp_worker_spin_us) */
    /* Devices (pippin/device.h): device: cuda:0 puts every stage there;
     * device: [cuda:0, cuda:1] gives rank r's stages entry r;
     * stage_devices: [cpu, cuda:0] gives stage s entry s (over device:).
     * Default: cpu. Specs are checked for form here, opened by the worker. */
    char *device;
    int n_rank_devices;
    char **rank_devices;
    int n_stage_devices;
    char **stage_devices;
} pp_config;

/* The device spec for a stage of a rank: stage_devices, else the rank's
 * device: entry, else device:, else "cpu". */
PP_API const char *pp_config_device(const pp_config *c, int rank, int stage);

/* Reads and checks a config file. */
PP_API pp_status pp_config_load(const char *path, pp_config **out);
/* The same from text in memory; name is used in messages and dir resolves
 * relative paths ("." if NULL). */
PP_API pp_status pp_config_parse(const char *text, size_t len, const char *name, const char *dir, pp_config **out);
PP_API void pp_config_free(pp_config *c);

/* This process's rank: rank_arg if >= 0, else the first of PIPPIN_RANK,
 * SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK that is set. Must be below
 * nranks. Errors name the variable that was wrong. */
PP_API pp_status pp_config_rank(int rank_arg, int nranks, int *rank);

#ifdef __cplusplus
}
#endif
#endif
