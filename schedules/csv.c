/* CSV form of a schedule: one row per rank, one cell per step (torch's
 * _dump_csv/_load_csv). Errors carry file:line:cell. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pippin/schedule.h"

#include "status_internal.h"
/* Longest cell we accept (a full compound action is far shorter). */
#define CELL_MAX 1024

/* End of the line starting at p (points at '\n' or end). */
static const char *line_end(const char *p, const char *end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    return nl ? nl : end;
}

/* Number of rows: lines, not counting trailing empty ones. */
static size_t count_rows(const char *text, size_t len) {
    const char *p = text, *end = text + len;
    size_t rows = 0, nonempty_rows = 0;
    while (p < end) {
        const char *e = line_end(p, end);
        const char *q = e;
        if (q > p && q[-1] == '\r') q--;
        rows++;
        int blank = 1;
        for (const char *c = p; c < q; c++)
            if (*c != ' ' && *c != '\t') blank = 0;
        if (!blank) nonempty_rows = rows;
        p = e < end ? e + 1 : end;
    }
    return nonempty_rows;
}

static pp_status parse_cell(pp_schedule *s, int rank, const char *cell, size_t n,
                            const char *file, size_t line, size_t col) {
    pp_action a, sub[PP_OVERLAP_MAX];
    int nsub;
    pp_status st = pp_action_parse(cell, n, &a, sub, &nsub);
    if (st == PP_OK)
        st = a.kind == PP_ACT_OVERLAP_F_B ? pp_schedule_append_overlap(s, rank, sub, nsub)
                                          : pp_schedule_append(s, rank, a);
    if (st != PP_OK) return pp_error_context(st, "%s:%zu: cell %zu", file, line, col);
    return PP_OK;
}

/* Parses one row (p..q, no newline) into rank's list. */
static pp_status parse_row(pp_schedule *s, int rank, const char *p, const char *q,
                           const char *file, size_t line) {
    char buf[CELL_MAX];
    size_t col = 0;
    if (p == q) return PP_OK; /* an empty row: a rank without actions */
    for (;;) {
        col++;
        const char *c = p;
        while (c < q && (*c == ' ' || *c == '\t')) c++;
        if (c < q && *c == '"') {
            /* Quoted cell: "" stands for one quote. */
            size_t n = 0;
            c++;
            for (;;) {
                if (c >= q)
                    return pp_error(PP_ERR_PARSE, "%s:%zu: cell %zu: unterminated quote", file,
                                    line, col);
                if (*c == '"') {
                    if (c + 1 < q && c[1] == '"') {
                        c++;
                    } else {
                        c++;
                        break;
                    }
                }
                if (n == sizeof buf)
                    return pp_error(PP_ERR_PARSE, "%s:%zu: cell %zu: longer than %d bytes",
                                    file, line, col, CELL_MAX);
                buf[n++] = *c++;
            }
            while (c < q && (*c == ' ' || *c == '\t')) c++;
            if (c < q && *c != ',')
                return pp_error(PP_ERR_PARSE, "%s:%zu: cell %zu: text after closing quote",
                                file, line, col);
            PP_TRY(parse_cell(s, rank, buf, n, file, line, col));
            if (c >= q) return PP_OK;
            p = c + 1;
        } else {
            const char *comma = memchr(p, ',', (size_t)(q - p));
            const char *stop = comma ? comma : q;
            if ((size_t)(stop - p) > CELL_MAX)
                return pp_error(PP_ERR_PARSE, "%s:%zu: cell %zu: longer than %d bytes", file,
                                line, col, CELL_MAX);
            PP_TRY(parse_cell(s, rank, p, (size_t)(stop - p), file, line, col));
            if (!comma) return PP_OK;
            p = comma + 1;
        }
    }
}

pp_status pp_schedule_parse_csv(const char *text, size_t len, const char *filename,
                                pp_schedule **out) {
    *out = NULL;
    const char *file = filename ? filename : "<csv>";
    size_t rows = count_rows(text, len);
    if (rows == 0) return pp_error(PP_ERR_PARSE, "%s: no rows (one row per rank expected)", file);
    if (rows > PP_SCHED_MAX_RANKS)
        return pp_error(PP_ERR_PARSE, "%s: %zu rows, more than %d ranks", file, rows,
                        PP_SCHED_MAX_RANKS);
    if (memchr(text, '\0', len))
        return pp_error(PP_ERR_PARSE, "%s: NUL byte in a text file", file);
    pp_schedule *s;
    PP_TRY(pp_schedule_new((int)rows, 0, 0, &s));
    const char *p = text, *end = text + len;
    for (size_t r = 0; r < rows; r++) {
        const char *e = line_end(p, end);
        const char *q = e;
        if (q > p && q[-1] == '\r') q--;
        pp_status st = parse_row(s, (int)r, p, q, file, r + 1);
        if (st != PP_OK) {
            pp_schedule_free(s);
            return st;
        }
        p = e < end ? e + 1 : end;
    }
    pp_status st = pp_schedule_infer(s);
    if (st != PP_OK) {
        pp_schedule_free(s);
        return pp_error_context(st, "%s", file);
    }
    snprintf(s->name, sizeof s->name, "csv");
    *out = s;
    return PP_OK;
}

pp_status pp_schedule_load_csv(const char *path, pp_schedule **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (len == cap) {
            if (cap > ((size_t)1 << 34)) {
                free(buf);
                fclose(f);
                return pp_error(PP_ERR_NOMEM, "%s: file too large", path);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return pp_error(PP_ERR_IO, "%s: read error", path);
    }
    pp_status st = pp_schedule_parse_csv(buf, len, path, out);
    free(buf);
    return st;
}

pp_status pp_schedule_write_csv(const pp_schedule *s, FILE *f) {
    char buf[PP_ACTION_STR_MAX];
    for (int r = 0; r < s->nranks; r++) {
        for (size_t k = 0; k < s->len[r]; k++) {
            if (k && fputc(',', f) == EOF) goto fail;
            pp_action_format(s, &s->acts[r][k], buf, sizeof buf);
            if (fputs(buf, f) == EOF) goto fail;
        }
        if (fputc('\n', f) == EOF) goto fail;
    }
    return PP_OK;
fail:
    return pp_error(PP_ERR_IO, "writing schedule CSV: %s", strerror(errno));
}

pp_status pp_schedule_save_csv(const pp_schedule *s, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    pp_status st = pp_schedule_write_csv(s, f);
    if (fclose(f) != 0 && st == PP_OK) st = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != PP_OK) return pp_error_context(st, "%s", path);
    return PP_OK;
}
