/* torch-style text grid of a schedule: steps down, ranks across. */
#include <stdlib.h>
#include <string.h>

#include "pippin/schedule.h"
#include "sched_internal.h"

#include "status_internal.h"
typedef struct strbuf {
    char *p;
    size_t n, cap;
    int oom;
} strbuf;

static void sb_grow(strbuf *b, size_t more) {
    if (b->oom || b->n + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void sb_put(strbuf *b, const char *s, size_t n) {
    sb_grow(b, n);
    if (b->oom) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_pad(strbuf *b, size_t n) {
    sb_grow(b, n);
    if (b->oom) return;
    memset(b->p + b->n, ' ', n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_rtrim(strbuf *b) {
    while (!b->oom && b->n && b->p[b->n - 1] == ' ') b->p[--b->n] = '\0';
}

pp_status pp_sched_table_range(const pp_schedule *s, long first, long last, long err_step,
                               char **out) {
    *out = NULL;
    long steps = 0;
    for (int r = 0; r < s->nranks; r++)
        if ((long)s->len[r] > steps) steps = (long)s->len[r];
    if (first < 0) first = 0;
    if (last >= steps) last = steps - 1;
    size_t *width = calloc((size_t)s->nranks, sizeof *width);
    if (!width) return pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    char cell[PP_ACTION_STR_MAX];
    for (int r = 0; r < s->nranks; r++) {
        width[r] = (size_t)snprintf(cell, sizeof cell, "Rank %d", r);
        for (long k = first; k <= last && k < (long)s->len[r]; k++) {
            size_t w = (size_t)pp_action_format(s, &s->acts[r][k], cell, sizeof cell);
            if (w > width[r]) width[r] = w;
        }
    }
    int digits = snprintf(cell, sizeof cell, "%ld", steps > 0 ? steps - 1 : 0);
    size_t label_w = 5 + (size_t)digits; /* "Step " + digits */
    strbuf b = {0};
    if (first > 0 || last < steps - 1) {
        int n = snprintf(cell, sizeof cell, "(steps %ld..%ld of %ld)\n", first, last, steps);
        sb_put(&b, cell, (size_t)n);
    }
    sb_pad(&b, label_w + 2);
    for (int r = 0; r < s->nranks; r++) {
        int n = snprintf(cell, sizeof cell, "Rank %d", r);
        if (r) sb_put(&b, " ", 1);
        sb_put(&b, cell, (size_t)n);
        sb_pad(&b, width[r] - (size_t)n);
    }
    sb_rtrim(&b);
    sb_put(&b, "\n", 1);
    for (long k = first; k <= last; k++) {
        int n = snprintf(cell, sizeof cell, "Step %0*ld: ", digits, k);
        sb_put(&b, cell, (size_t)n);
        for (int r = 0; r < s->nranks; r++) {
            size_t w = 0;
            if (k < (long)s->len[r])
                w = (size_t)pp_action_format(s, &s->acts[r][k], cell, sizeof cell);
            if (r) sb_put(&b, " ", 1);
            sb_put(&b, cell, w);
            sb_pad(&b, width[r] - w);
        }
        sb_rtrim(&b);
        if (k == err_step) sb_put(&b, " <-- ERROR HERE", 15);
        sb_put(&b, "\n", 1);
    }
    free(width);
    if (b.oom) {
        free(b.p);
        return pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    }
    if (!b.p) sb_put(&b, "", 0);
    *out = b.p;
    return PP_OK;
}

pp_status pp_schedule_format_table(const pp_schedule *s, long err_step, char **out) {
    long steps = 0;
    for (int r = 0; r < s->nranks; r++)
        if ((long)s->len[r] > steps) steps = (long)s->len[r];
    return pp_sched_table_range(s, 0, steps - 1, err_step, out);
}
