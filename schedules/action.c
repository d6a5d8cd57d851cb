/* Action kinds and the text form of an action (torch's `_Action` strings). */
#include <stdio.h>
#include <string.h>

#include "pippin/schedule.h"

#include "status_internal.h"
static const char *const kind_names[PP_ACT_KIND_COUNT] = {
    [PP_ACT_IDLE] = "",
    [PP_ACT_F] = "F",
    [PP_ACT_I] = "I",
    [PP_ACT_W] = "W",
    [PP_ACT_B] = "B",
    [PP_ACT_SEND_F] = "SEND_F",
    [PP_ACT_RECV_F] = "RECV_F",
    [PP_ACT_SEND_B] = "SEND_B",
    [PP_ACT_RECV_B] = "RECV_B",
    [PP_ACT_UNSHARD] = "UNSHARD",
    [PP_ACT_RESHARD] = "RESHARD",
    [PP_ACT_REDUCE_GRAD] = "REDUCE_GRAD",
    [PP_ACT_OVERLAP_F_B] = "OVERLAP_F_B",
};

const char *pp_act_kind_name(pp_act_kind kind) {
    if ((int)kind < 0 || kind >= PP_ACT_KIND_COUNT) return "?";
    return kind_names[kind];
}

int pp_act_is_compute(pp_act_kind kind) {
    return kind == PP_ACT_F || kind == PP_ACT_I || kind == PP_ACT_W || kind == PP_ACT_B ||
           kind == PP_ACT_OVERLAP_F_B;
}

/* Kinds that carry no microbatch number. */
static int kind_without_mb(int kind) {
    return kind == PP_ACT_UNSHARD || kind == PP_ACT_RESHARD || kind == PP_ACT_REDUCE_GRAD;
}

/* Writes x's decimal digits at out; returns how many (at most 10). */
static size_t put_uint(char *out, uint32_t x) {
    char rev[12];
    size_t n = 0;
    do {
        rev[n++] = (char)('0' + x % 10);
        x /= 10;
    } while (x);
    for (size_t k = 0; k < n; k++) out[k] = rev[n - 1 - k];
    return n;
}

/* Longest text of a plain action: sign, 10 digits, kind, 10 digits. */
#define PLAIN_MAX 40

/* Text of a plain action into out (PLAIN_MAX bytes); returns its length.
 * Hand-written rather than snprintf: `pippin schedule` formats tens of
 * millions of actions and snprintf was most of its time. */
static size_t text_plain(const pp_action *a, char *out) {
    if (a->kind == PP_ACT_IDLE) return 0;
    size_t n = 0;
    uint32_t stage = (uint32_t)a->stage;
    if (a->stage < 0) {
        out[n++] = '-';
        stage = 0u - stage;
    }
    n += put_uint(out + n, stage);
    const char *name = pp_act_kind_name(a->kind);
    size_t len = strlen(name);
    memcpy(out + n, name, len);
    n += len;
    if (a->mb >= 0 && !kind_without_mb(a->kind)) n += put_uint(out + n, (uint32_t)a->mb);
    return n;
}

/* snprintf's contract: at most n-1 bytes and a NUL; returns the full length. */
static int copy_out(const char *text, size_t len, char *buf, size_t n) {
    if (n) {
        size_t k = len < n - 1 ? len : n - 1;
        memcpy(buf, text, k);
        buf[k] = '\0';
    }
    return (int)len;
}

static int format_plain(const pp_action *a, char *buf, size_t n) {
    char t[PLAIN_MAX];
    return copy_out(t, text_plain(a, t), buf, n);
}

int pp_action_format(const pp_schedule *s, const pp_action *a, char *buf, size_t n) {
    if (a->kind != PP_ACT_OVERLAP_F_B) return format_plain(a, buf, n);
    static const char tail[] = ")OVERLAP_F_B";
    const pp_action *sub = pp_schedule_subs(s, a);
    /* Sub-actions go in while they fit in PP_ACTION_STR_MAX bytes. */
    char t[PP_ACTION_STR_MAX + sizeof tail], one[PLAIN_MAX];
    size_t used = 0;
    t[used++] = '(';
    for (int k = 0; sub && k < a->nsub; k++) {
        if (k) t[used++] = ';';
        size_t len = text_plain(&sub[k], one);
        if (len >= PP_ACTION_STR_MAX - used) break;
        memcpy(t + used, one, len);
        used += len;
    }
    memcpy(t + used, tail, sizeof tail - 1);
    return copy_out(t, used + sizeof tail - 1, buf, n);
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Reads decimal digits from t[*i..len) into *v (at most limit); returns the
 * number of digits read, -1 on overflow. */
static int read_uint(const char *t, size_t len, size_t *i, long limit, long *v) {
    int nd = 0;
    long x = 0;
    while (*i < len && t[*i] >= '0' && t[*i] <= '9') {
        x = x * 10 + (t[*i] - '0');
        if (x > limit) return -1;
        (*i)++;
        nd++;
    }
    *v = x;
    return nd;
}

/* Longest first, so RECV_F is not read as something shorter. */
static const struct {
    const char *name;
    int kind;
} kind_table[] = {
    {"REDUCE_GRAD", PP_ACT_REDUCE_GRAD}, {"UNSHARD", PP_ACT_UNSHARD},
    {"RESHARD", PP_ACT_RESHARD},         {"SEND_F", PP_ACT_SEND_F},
    {"RECV_F", PP_ACT_RECV_F},           {"SEND_B", PP_ACT_SEND_B},
    {"RECV_B", PP_ACT_RECV_B},           {"F", PP_ACT_F},
    {"I", PP_ACT_I},                     {"W", PP_ACT_W},
    {"B", PP_ACT_B},
};

static pp_status parse_plain(const char *t, size_t len, pp_action *out) {
    size_t i = 0;
    long stage, mb;
    int nd = read_uint(t, len, &i, PP_SCHED_MAX_STAGES - 1, &stage);
    if (nd < 0)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': stage number above %d", (int)len,
                        t, PP_SCHED_MAX_STAGES - 1);
    if (nd == 0)
        return pp_error(PP_ERR_PARSE,
                        "invalid action '%.*s': expected [stage][kind][microbatch], e.g. 2F0",
                        (int)len, t);
    int kind = -1;
    for (size_t k = 0; k < sizeof kind_table / sizeof kind_table[0]; k++) {
        size_t n = strlen(kind_table[k].name);
        if (len - i >= n && memcmp(t + i, kind_table[k].name, n) == 0) {
            kind = kind_table[k].kind;
            i += n;
            break;
        }
    }
    if (kind < 0)
        return pp_error(PP_ERR_PARSE,
                        "invalid action '%.*s': unknown kind (F, I, W, B, SEND_F, RECV_F, "
                        "SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)",
                        (int)len, t);
    nd = read_uint(t, len, &i, PP_SCHED_MAX_MB - 1, &mb);
    if (nd < 0)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': microbatch number above %d",
                        (int)len, t, PP_SCHED_MAX_MB - 1);
    if (i != len)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': unexpected '%c' at offset %zu",
                        (int)len, t, t[i], i);
    if (kind_without_mb(kind) && nd > 0)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': %s takes no microbatch", (int)len,
                        t, pp_act_kind_name(kind));
    if (!kind_without_mb(kind) && nd == 0)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': %s needs a microbatch number",
                        (int)len, t, pp_act_kind_name(kind));
    *out = pp_act(kind, (int)stage, nd ? (int)mb : -1);
    return PP_OK;
}

pp_status pp_action_parse(const char *text, size_t len, pp_action *out,
                          pp_action sub[PP_OVERLAP_MAX], int *nsub) {
    *nsub = 0;
    while (len && is_blank(text[0])) text++, len--;
    while (len && is_blank(text[len - 1])) len--;
    if (len == 0) {
        *out = pp_act(PP_ACT_IDLE, -1, -1);
        return PP_OK;
    }
    if (text[0] != '(') return parse_plain(text, len, out);
    const char *close = memchr(text, ')', len);
    if (!close)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': missing ')'", (int)len, text);
    size_t inner = (size_t)(close - text) - 1;
    if (memchr(text + 1, '(', inner))
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': nested compound action", (int)len,
                        text);
    const char *kind = close + 1;
    size_t klen = len - (size_t)(kind - text);
    if (klen != strlen("OVERLAP_F_B") || memcmp(kind, "OVERLAP_F_B", klen) != 0)
        return pp_error(PP_ERR_PARSE,
                        "invalid action '%.*s': a compound action must end in OVERLAP_F_B",
                        (int)len, text);
    /* Sub-actions separated by ';' (empty pieces skipped, as torch does). */
    const char *p = text + 1, *end = text + 1 + inner;
    while (p <= end) {
        const char *semi = memchr(p, ';', (size_t)(end - p));
        const char *stop = semi ? semi : end;
        const char *a = p;
        size_t n = (size_t)(stop - p);
        while (n && is_blank(a[0])) a++, n--;
        while (n && is_blank(a[n - 1])) n--;
        if (n) {
            if (*nsub == PP_OVERLAP_MAX)
                return pp_error(PP_ERR_PARSE, "invalid action '%.*s': more than %d sub-actions",
                                (int)len, text, PP_OVERLAP_MAX);
            if (a[0] == '(')
                return pp_error(PP_ERR_PARSE, "invalid action '%.*s': nested compound action",
                                (int)len, text);
            pp_status st = parse_plain(a, n, &sub[*nsub]);
            if (st != PP_OK) return st;
            (*nsub)++;
        }
        if (!semi) break;
        p = semi + 1;
    }
    if (*nsub == 0)
        return pp_error(PP_ERR_PARSE, "invalid action '%.*s': OVERLAP_F_B without sub-actions",
                        (int)len, text);
    *out = pp_act(PP_ACT_OVERLAP_F_B, -1, -1);
    out->nsub = (uint8_t)*nsub;
    return PP_OK;
}
