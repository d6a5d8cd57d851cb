/* torch-style text grid of a schedule: steps down, ranks across. Written
 * row by row so that printing a large schedule holds one row, not the
 * whole grid. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/schedule.h"
#include "sched_internal.h"

#include "status_internal.h"
typedef struct row {
    char *p;
    size_t n, cap;
} row;

static int row_room(row *b, size_t more) {
    if (b->n + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* Appends n bytes of s, then pad spaces. */
static int row_put(row *b, const char *s, size_t n, size_t pad) {
    if (row_room(b, n + pad)) return -1;
    memcpy(b->p + b->n, s, n);
    memset(b->p + b->n + n, ' ', pad);
    b->n += n + pad;
    return 0;
}

static void row_rtrim(row *b) {
    while (b->n && b->p[b->n - 1] == ' ') b->n--;
}

static long steps_of(const pp_schedule *s) {
    long steps = 0;
    for (int r = 0; r < s->nranks; r++)
        if ((long)s->len[r] > steps) steps = (long)s->len[r];
    return steps;
}

/* Writes steps first..last (clamped) to f; err_step's row is marked. */
static pp_status write_range(const pp_schedule *s, long first, long last, long err_step,
                             FILE *f) {
    long steps = steps_of(s);
    if (first < 0) first = 0;
    if (last >= steps) last = steps - 1;
    size_t *width = calloc((size_t)s->nranks, sizeof *width);
    if (!width) return pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    char cell[PP_ACTION_STR_MAX];
    for (int r = 0; r < s->nranks; r++) {
        width[r] = (size_t)snprintf(cell, sizeof cell, "Rank %d", r);
        for (long k = first; k <= last && k < (long)s->len[r]; k++) {
            size_t w = (size_t)pp_action_format(s, &s->acts[r][k], cell, sizeof cell);
            if (w > sizeof cell - 2) w = sizeof cell - 2; /* as truncated below */
            if (w > width[r]) width[r] = w;
        }
    }
    int digits = snprintf(cell, sizeof cell, "%ld", steps > 0 ? steps - 1 : 0);
    size_t label_w = 5 + (size_t)digits; /* "Step " + digits */
    row b = {0};
    int bad = 0; /* -1: out of memory, 1: write failed */
    if (first > 0 || last < steps - 1)
        bad = fprintf(f, "(steps %ld..%ld of %ld)\n", first, last, steps) < 0;
    bad = bad ? bad : row_put(&b, "", 0, label_w + 2);
    for (int r = 0; r < s->nranks && !bad; r++) {
        int n = snprintf(cell, sizeof cell, "%sRank %d", r ? " " : "", r);
        bad = row_put(&b, cell, (size_t)n, width[r] - (size_t)n + (r ? 1 : 0));
    }
    for (long k = first - 1; k <= last && !bad; k++) {
        if (k >= first) { /* k == first - 1 is the header, already in b */
            b.n = 0;
            int n = snprintf(cell, sizeof cell, "Step %0*ld: ", digits, k);
            bad = row_put(&b, cell, (size_t)n, 0);
            for (int r = 0; r < s->nranks && !bad; r++) {
                size_t w = 0;
                if (r) cell[w++] = ' ';
                if (k < (long)s->len[r]) {
                    size_t a = (size_t)pp_action_format(s, &s->acts[r][k], cell + w,
                                                        sizeof cell - w);
                    w += a < sizeof cell - 2 ? a : sizeof cell - 2; /* truncated */
                }
                bad = row_put(&b, cell, w, width[r] + (r ? 1 : 0) - w);
            }
            if (bad) break;
        }
        row_rtrim(&b);
        if (k >= first && k == err_step) bad = row_put(&b, " <-- ERROR HERE", 15, 0);
        bad = bad ? bad : row_put(&b, "\n", 1, 0);
        if (!bad && fwrite(b.p, 1, b.n, f) != b.n) bad = 1;
    }
    free(b.p);
    free(width);
    if (bad < 0) return pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    if (bad) return pp_error(PP_ERR_IO, "schedule table: write failed: %s", strerror(errno));
    return PP_OK;
}

pp_status pp_sched_table_range(const pp_schedule *s, long first, long last, long err_step,
                               char **out) {
    *out = NULL;
    size_t len;
    FILE *f = open_memstream(out, &len);
    if (!f) return pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    pp_status st = write_range(s, first, last, err_step, f);
    if (fclose(f) != 0 && st == PP_OK)
        st = pp_error(PP_ERR_NOMEM, "schedule table: out of memory");
    if (st != PP_OK) {
        free(*out);
        *out = NULL;
    }
    return st;
}

pp_status pp_schedule_format_table(const pp_schedule *s, long err_step, char **out) {
    return pp_sched_table_range(s, 0, steps_of(s) - 1, err_step, out);
}

pp_status pp_schedule_write_table(const pp_schedule *s, FILE *f) {
    return write_range(s, 0, steps_of(s) - 1, -1, f);
}
