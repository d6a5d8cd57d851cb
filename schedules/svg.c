/* SVG timeline: a row per rank, coloured boxes over a pale idle band. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "pippin/sched_trace.h"

#include "status_internal.h"
#define PLOT_W 1200.0
#define LEFT 72.0
#define RIGHT 24.0
#define TOP 36.0
#define ROW_H 28.0
#define BAR_H 18.0
#define COMM_H 5.0
/* Tooltips only while the file stays a reasonable size. */
#define MAX_TOOLTIPS 20000

static const char *colour(int kind, int lane) {
    if (lane == PP_LANE_COMM) return "#7f7f7f";
    switch (kind) {
    case PP_ACT_F: return "#4e79a7";
    case PP_ACT_I: return "#f28e2b";
    case PP_ACT_W: return "#59a14f";
    case PP_ACT_B: return "#e15759";
    case PP_ACT_OVERLAP_F_B: return "#b07aa1";
    default: return "#7f7f7f";
    }
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* 1, 2 or 5 times a power of ten, about span / 10. */
static double tick_step(double span) {
    if (!(span > 0)) return 1;
    double raw = span / 10, p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void label_for(const pp_trace_event *e, char *buf, size_t n) {
    if (e->kind == PP_ACT_OVERLAP_F_B)
        snprintf(buf, n, "%d|%d", (int)e->mb, (int)e->mb2);
    else if (e->mb >= 0)
        snprintf(buf, n, "%d", (int)e->mb);
    else
        buf[0] = '\0';
}

pp_status pp_trace_write_svg(const pp_trace *t, FILE *f, const char *title) {
    double t0 = 0, t1 = 0;
    for (size_t k = 0; k < t->n; k++) {
        if (t->ev[k].start < t0) t0 = t->ev[k].start;
        if (t->ev[k].end > t1) t1 = t->ev[k].end;
    }
    if (!(t1 > t0)) t1 = t0 + 1;
    double scale = PLOT_W / (t1 - t0);
    double rows_h = ROW_H * t->nranks;
    double width = LEFT + PLOT_W + RIGHT, height = TOP + rows_h + 70;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
    fprintf(f, "<text x=\"%.1f\" y=\"22\" font-size=\"15\">", LEFT);
    xml_text(f, title && *title ? title : "pipeline schedule");
    fprintf(f, "</text>\n");
    /* Idle is the pale band behind each rank's boxes. */
    for (int r = 0; r < t->nranks; r++) {
        double y = TOP + r * ROW_H;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"end\">rank %d</text>\n"
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n",
                LEFT - 8, y + BAR_H / 2 + 4, r, LEFT, y + 2, PLOT_W, BAR_H);
    }
    char lab[64], name[PP_ACTION_STR_MAX];
    int tips = t->n <= MAX_TOOLTIPS;
    for (size_t k = 0; k < t->n; k++) {
        const pp_trace_event *e = &t->ev[k];
        double x = LEFT + (e->start - t0) * scale, w = (e->end - e->start) * scale;
        if (w < 0.5) w = 0.5;
        int comm = e->lane == PP_LANE_COMM;
        double y = TOP + e->rank * ROW_H + (comm ? BAR_H + 3 : 2);
        double h = comm ? COMM_H : BAR_H;
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s>",
                x, y, w, h, colour(e->kind, e->lane), comm ? "" : " stroke=\"white\" stroke-width=\"0.5\"");
        if (tips) {
            if (e->kind == PP_ACT_OVERLAP_F_B)
                snprintf(name, sizeof name, "(%dF%d;%dB%d)OVERLAP_F_B", (int)e->stage, (int)e->mb,
                         (int)e->stage2, (int)e->mb2);
            else {
                pp_action a = pp_act((pp_act_kind)e->kind, e->stage, e->mb);
                pp_action_format(NULL, &a, name, sizeof name);
            }
            fprintf(f, "<title>rank %d %s%s [%g, %g]</title>", (int)e->rank, name,
                    comm ? " transfer" : "", e->start, e->end);
        }
        fprintf(f, "</rect>\n");
        if (comm) continue;
        label_for(e, lab, sizeof lab);
        double need = 6.5 * (double)strlen(lab) + 3;
        if (lab[0] && w >= need)
            fprintf(f,
                    "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" fill=\"white\" "
                    "text-anchor=\"middle\">%s</text>\n",
                    x + w / 2, y + BAR_H / 2 + 4, lab);
    }
    /* Time axis. */
    double ay = TOP + rows_h + 6, step = tick_step(t1 - t0);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", LEFT,
            ay, LEFT + PLOT_W, ay);
    for (double v = ceil(t0 / step) * step; v <= t1 + step * 1e-9; v += step) {
        double x = LEFT + (v - t0) * scale;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%g</text>\n",
                x, ay, x, ay + 4, x, ay + 15, v);
    }
    /* Legend. */
    static const struct {
        const char *name;
        int kind, lane;
    } leg[] = {{"F forward", PP_ACT_F, 0},        {"I backward-input", PP_ACT_I, 0},
               {"W backward-weight", PP_ACT_W, 0}, {"B full backward", PP_ACT_B, 0},
               {"F+B overlapped", PP_ACT_OVERLAP_F_B, 0}, {"transfer", PP_ACT_SEND_F, 1}};
    double lx = LEFT, ly = ay + 32;
    for (size_t k = 0; k < sizeof leg / sizeof leg[0]; k++) {
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">%s</text>\n",
                lx, ly - 10, colour(leg[k].kind, leg[k].lane), lx + 16, ly, leg[k].name);
        lx += 30 + 6.5 * (double)strlen(leg[k].name);
    }
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"#eeeeee\" "
            "stroke=\"#cccccc\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">idle</text>\n",
            lx, ly - 10, lx + 16, ly);
    if (fprintf(f, "</svg>\n") < 0 || ferror(f))
        return pp_error(PP_ERR_IO, "writing SVG: %s", strerror(errno));
    return PP_OK;
}

pp_status pp_trace_save_svg(const pp_trace *t, const char *path, const char *title) {
    FILE *f = fopen(path, "wb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    pp_status st = pp_trace_write_svg(t, f, title);
    if (fclose(f) != 0 && st == PP_OK) st = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    if (st != PP_OK) return pp_error_context(st, "%s", path);
    return PP_OK;
}
