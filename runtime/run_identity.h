/* Internal: a run's identity, what every rank of one run must agree on,
 * computed by each rank from what it loaded, exchanged at start-up and
 * compared so that a skewed rank (another learning rate, schedule, data
 * file, model file, a tied parameter's copy that differs, a pipe.json
 * without its shared_parameters) is refused before the first step, naming
 * the key or file that differs.
 *
 * An identity is an ordered list of entries (key, 64-bit hash, kind):
 *
 *   VALUE  a config value that affects the numbers, hashed from its
 *          canonical text (doubles as %.17g, so any change of bits shows):
 *          mode, schedule, microbatches, batch_size, steps, loss,
 *          optimizer.kind and optimizer.<each hyper-parameter>, dims.<name>,
 *          split.before, split.after, split.transmit_shared, freeze,
 *          text.seq, n_ranks, ranks (the endpoints),
 *          security (on/off: each rank reads only its own secret key, so the
 *          key files are not compared), run_id (when given), checkpoint
 *          (on/off; not the directory) and checkpoint.every. Not: bind,
 *          timeout_ms, output_dir, checkpoint.keep, insecure (they change
 *          no number). detail: the value's text.
 *   FILE   a file's bytes: model (model:), stages/pipe.json (stages:),
 *          schedule (csv:FILE), data.<input>, text.file, text.vocab.
 *          detail: the path this rank read.
 *   PARAM  param.<name>: an initializer of kind PP_VALUE_PARAM in one of this
 *          rank's stage graphs, hashed over dtype, shape and bytes (its
 *          initial values when computed before the first step). flags has
 *          PP_RUN_IDENTITY_SHARED when the pipe lists the parameter as shared
 *          and lists this stage among its holders. stage: the stage.
 *   CONST  const.<name>: any other initializer of a stage graph (buffers
 *          such as a causal mask, frozen parameters, copied constants);
 *          initializers the autodiff made ("autodiff/...") are left out:
 *          their names are per graph.
 *
 * VALUE and FILE keys are the common part: every rank has the same set with
 * the same hashes (pp_run_identity_digest hashes them, order-independent).
 *
 * PARAM and CONST keys are per rank, because with stages: each rank loads
 * only its own stage files. The rule chosen (rather than "shared.<name>"
 * entries for the listed shared parameters only): every rank contributes
 * every initializer it holds by name, and a name held by two ranks (or two
 * stages of one rank) must have equal hashes; if both hold it as a PARAM of
 * different stages, the pipe must list it as shared in both. Initializer names are unique
 * in the model a split came from, so two stages holding one name hold copies
 * of one initializer. This catches a tied copy that differs (whether or not
 * pipe.json lists it), a pipe.json without its shared_parameters (each copy
 * would then be trained on its own), and a differing copied buffer. Not
 * caught (no rank sees another's stage file): a change to a stage graph's
 * nodes or to a parameter held by one stage only.
 *
 * Thread safety: an identity is read-only after compute/decode. */
#ifndef PIPPIN_RUNTIME_RUN_IDENTITY_H
#define PIPPIN_RUNTIME_RUN_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

#include "pippin/config.h"
#include "pippin/graph.h"
#include "pippin/pipe.h"
#include "pippin/stage.h"

typedef enum pp_run_identity_kind {
    PP_RUN_IDENTITY_VALUE = 0,
    PP_RUN_IDENTITY_FILE = 1,
    PP_RUN_IDENTITY_PARAM = 2,
    PP_RUN_IDENTITY_CONST = 3
} pp_run_identity_kind;

enum { PP_RUN_IDENTITY_SHARED = 1 }; /* flags of a PARAM entry */

/* Limits (encode/decode refuse more). */
enum {
    PP_RUN_IDENTITY_MAX_KEY = 1024,      /* bytes of a key */
    PP_RUN_IDENTITY_MAX_DETAIL = 256,    /* bytes of a detail (longer ones are cut, "...") */
    PP_RUN_IDENTITY_MAX_ENTRIES = 1 << 20
};
#define PP_RUN_IDENTITY_MAX_BYTES ((size_t)64 << 20) /* an encoded identity */

typedef struct pp_run_identity_entry {
    char *key;      /* "optimizer.lr", "data.idx", "param.tok_emb.weight" */
    uint64_t hash;
    uint8_t kind;   /* pp_run_identity_kind */
    uint8_t flags;  /* PP_RUN_IDENTITY_SHARED */
    int32_t stage;  /* PARAM/CONST: the stage holding it; else -1 */
    char *detail;   /* for messages only, never compared: a value's text, a file's path */
} pp_run_identity_entry;

typedef struct pp_run_identity pp_run_identity;

/* This rank's identity from its config, its pipe (p->shared; may be NULL
 * when it has no stages to add) and its stage graphs: graphs[i] is stage
 * stage_index[i] (e.g. p->stages[k] for the stages this rank runs, before
 * pp_stage_from_pipe moves them out). Reads the files the config names.
 * Errors: a file that cannot be read (named), two local copies of one
 * initializer that differ or an unlisted PARAM copy (named), a name too long. */
pp_status pp_run_identity_compute_graphs(const pp_config *c, const pp_pipe *p, int n,
                                         const pp_graph *const *graphs, const int *stage_index,
                                         pp_run_identity **out);
/* The same from built stages (pp_stage_graph, pp_stage_index). */
pp_status pp_run_identity_compute(const pp_config *c, const pp_pipe *p, int n_stages, pp_stage *const *stages,
                                  pp_run_identity **out);
void pp_run_identity_free(pp_run_identity *id);

int pp_run_identity_count(const pp_run_identity *id);
const pp_run_identity_entry *pp_run_identity_entry_at(const pp_run_identity *id, int i);
/* The entry with this key, or NULL. */
const pp_run_identity_entry *pp_run_identity_find(const pp_run_identity *id, const char *key);

/* A compact little-endian binary form (malloc'd; caller frees):
 * "PPRI", u8 version 1, 3 zero bytes, u32 count, then per entry u8 kind,
 * u8 flags, u16 key bytes, u16 detail bytes, i32 stage, u64 hash, key,
 * detail. */
pp_status pp_run_identity_encode(const pp_run_identity *id, uint8_t **bytes, size_t *n);
/* Safe on hostile bytes: every length bounds-checked, sizes limited, keys
 * and details free of control characters, no duplicate key, nothing left
 * over. Errors are PP_ERR_PARSE naming what is wrong. */
pp_status pp_run_identity_decode(const uint8_t *bytes, size_t n, pp_run_identity **out);

/* PP_OK when the two ranks' identities agree, else PP_ERR_INVALID naming the
 * first difference in mine's order (then theirs' common keys mine lacks),
 * e.g. "rank 2's optimizer.lr (0.01) differs from rank 0's (0.003): the
 * ranks' configs do not agree", "rank 2's data.idx differs from rank 0's:
 * the file /d/idx.npy differs from /e/idx.npy", "rank 3's copy of shared
 * parameter 'tok_emb.weight' (stage 3) differs from rank 0's (stage 0)". */
pp_status pp_run_identity_compare(const pp_run_identity *mine, int my_rank, const pp_run_identity *theirs,
                                  int their_rank);

/* One hash of the common part (VALUE and FILE entries, in key order): the
 * same on every rank of an agreeing run; usable as a wire run id. */
uint64_t pp_run_identity_digest(const pp_run_identity *id);

/* For pp_agree_bytes (runtime/agree.h): user is a pp_run_identity_peer;
 * decodes a peer's bytes and compares them with mine. */
typedef struct pp_run_identity_peer {
    const pp_run_identity *mine;
    int my_rank;
} pp_run_identity_peer;
pp_status pp_run_identity_check_peer(void *user, int rank, const uint8_t *bytes, size_t n);

#endif
