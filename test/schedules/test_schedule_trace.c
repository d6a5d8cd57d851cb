/* Timelines: events from the simulator, Chrome trace JSON, SVG. */
#include <json-c/json.h>
#include <unistd.h>

#include "pippin/sched_trace.h"
#include "sched_test_util.h"

#include "test_filter.h"
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = '\0';
    fclose(f);
    return b;
}

static size_t count(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

static pp_trace *traced(const pp_schedule *s, const pp_cost_model *cm, pp_sim_result **r) {
    pp_trace *t;
    assert_int_equal(pp_trace_new(s->nranks, &t), PP_OK);
    assert_int_equal(pp_simulate(s, cm, t, r), PP_OK);
    return t;
}

static void test_events(void **state) {
    (void)state;
    pp_schedule *s = gen(PP_SCHED_1F1B, 3, 4, 0);
    pp_cost_model *cm = uniform_costs(3, 1, 1, 1, 0.25);
    pp_sim_result *r;
    pp_trace *t = traced(s, cm, &r);
    size_t compute = 0, comm = 0;
    for (size_t k = 0; k < t->n; k++) {
        const pp_trace_event *e = &t->ev[k];
        assert_true(e->end >= e->start);
        assert_true(e->end <= r->makespan + 1e-9);
        if (e->lane == PP_LANE_COMPUTE) {
            compute++;
            assert_true(e->kind == PP_ACT_F || e->kind == PP_ACT_B);
            assert_near(e->end - e->start, e->kind == PP_ACT_F ? 1 : 2);
        } else {
            comm++;
            assert_near(e->end - e->start, 0.25);
        }
    }
    assert_int_equal(compute, 3 * 2 * 4);
    /* Activations 0->1, 1->2 and gradients 2->1, 1->0, for 4 microbatches. */
    assert_int_equal(comm, 4 * 4);
    /* Per rank, compute events do not overlap. */
    for (int rank = 0; rank < 3; rank++) {
        double end = -1;
        for (size_t k = 0; k < t->n; k++)
            if (t->ev[k].rank == rank && t->ev[k].lane == PP_LANE_COMPUTE) {
                assert_true(t->ev[k].start >= end - 1e-12);
                end = t->ev[k].end;
            }
    }
    pp_trace_event bad = {7, 0, 0, PP_ACT_F, 0, -1, -1, 0, 1};
    assert_int_equal(pp_trace_add(t, &bad), PP_ERR_INVALID);
    pp_trace_free(t);
    pp_sim_result_free(r);
    pp_cost_model_free(cm);
    pp_schedule_free(s);
}

static void test_chrome(void **state) {
    (void)state;
    pp_schedule *s = gen(PP_SCHED_DUALPIPEV, 2, 4, 2);
    pp_sim_result *r;
    pp_cost_model *cm = uniform_costs(4, 1, 1, 1, 0.1);
    pp_trace *t = traced(s, cm, &r);
    char path[] = "/tmp/pippin_trace_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pp_trace_save_chrome(t, path, 1000.0), PP_OK);
    char *text = slurp(path);
    json_object *root = json_tokener_parse(text);
    assert_non_null(root);
    json_object *evs;
    assert_true(json_object_object_get_ex(root, "traceEvents", &evs));
    size_t n = json_object_array_length(evs), x = 0, meta = 0, overlap = 0;
    for (size_t k = 0; k < n; k++) {
        json_object *e = json_object_array_get_idx(evs, k), *ph, *name, *pid, *ts, *dur;
        assert_true(json_object_object_get_ex(e, "ph", &ph));
        assert_true(json_object_object_get_ex(e, "name", &name));
        assert_true(json_object_object_get_ex(e, "pid", &pid));
        if (!strcmp(json_object_get_string(ph), "M")) {
            meta++;
            continue;
        }
        x++;
        assert_true(json_object_object_get_ex(e, "ts", &ts));
        assert_true(json_object_object_get_ex(e, "dur", &dur));
        assert_true(json_object_get_double(dur) >= 0);
        assert_true(json_object_get_int(pid) >= 0 && json_object_get_int(pid) < 2);
        if (strstr(json_object_get_string(name), "OVERLAP_F_B")) overlap++;
    }
    assert_int_equal(x, t->n);
    assert_int_equal(meta, 2 * 4);
    assert_true(overlap > 0);
    assert_contains(text, "\"name\":\"0F0\"");
    assert_contains(text, "\"name\":\"rank 1\"");
    json_object_put(root);
    free(text);
    unlink(path);
    pp_trace_free(t);
    pp_sim_result_free(r);
    pp_cost_model_free(cm);
    pp_schedule_free(s);
}

static void test_svg(void **state) {
    (void)state;
    pp_schedule *s = gen(PP_SCHED_ZB_H1, 4, 8, 0);
    pp_sim_result *r;
    pp_cost_model *cm = uniform_costs(4, 2, 2, 1, 0.5);
    pp_trace *t = traced(s, cm, &r);
    char path[] = "/tmp/pippin_svg_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(pp_trace_save_svg(t, path, "zb-h1 <p=4>"), PP_OK);
    char *text = slurp(path);
    assert_true(strncmp(text, "<?xml", 5) == 0);
    assert_contains(text, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
    assert_contains(text, "zb-h1 &lt;p=4&gt;");
    for (int rank = 0; rank < 4; rank++) {
        char lab[32];
        snprintf(lab, sizeof lab, ">rank %d</text>", rank);
        assert_contains(text, lab);
    }
    /* Distinct colours for F, I, W and transfers, and the idle band. */
    assert_contains(text, "#4e79a7");
    assert_contains(text, "#f28e2b");
    assert_contains(text, "#59a14f");
    assert_contains(text, "#7f7f7f");
    assert_contains(text, "#eeeeee");
    assert_contains(text, ">W backward-weight</text>");
    /* Every event is a box, with microbatch numbers written in them. */
    assert_int_equal(count(text, "<rect x=") - 4 - 7, t->n);
    assert_int_equal(count(text, "<title>"), t->n);
    assert_contains(text, "text-anchor=\"middle\">7</text>");
    assert_true(count(text, "</svg>") == 1);
    free(text);
    unlink(path);
    assert_int_equal(pp_trace_save_svg(t, "/nonexistent/dir/x.svg", NULL), PP_ERR_IO);
    assert_contains(pp_last_error(), "/nonexistent/dir/x.svg");
    pp_trace_free(t);
    pp_sim_result_free(r);
    pp_cost_model_free(cm);
    pp_schedule_free(s);
}

/* The writer takes events from anywhere (a real run later): seconds in,
 * microseconds out. */
static void test_external_events(void **state) {
    (void)state;
    pp_trace *t;
    assert_int_equal(pp_trace_new(2, &t), PP_OK);
    pp_trace_event a = {0, 0, 3, PP_ACT_F, PP_LANE_COMPUTE, -1, -1, 0.5, 0.75};
    pp_trace_event b = {1, 1, 3, PP_ACT_B, PP_LANE_COMPUTE, -1, -1, 1.0, 1.5};
    assert_int_equal(pp_trace_add(t, &a), PP_OK);
    assert_int_equal(pp_trace_add(t, &b), PP_OK);
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(pp_trace_write_chrome(t, f, 1e6), PP_OK);
    long n = ftell(f);
    rewind(f);
    char *buf = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    assert_contains(buf, "\"name\":\"0F3\",\"cat\":\"F\",\"ph\":\"X\",\"pid\":0,\"tid\":0,"
                         "\"ts\":500000.000,\"dur\":250000.000");
    assert_contains(buf, "\"name\":\"1B3\"");
    free(buf);
    pp_trace_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_chrome),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_external_events),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
