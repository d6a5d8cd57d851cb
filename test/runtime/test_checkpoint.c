/* Stage checkpoints (runtime/checkpoint.c): each tensor read once, straight
 * into the stage's parameters and optimizer state; a file refused for its
 * header leaves the stage as it was; a file cut short while it is read or
 * damaged is an error naming the file (and the tensor), never a signal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pippin/checkpoint.h"
#include "pippin/log.h"
#include "pippin/runner.h"
#include "test_util.h"

#include "test_filter.h"

static char tmpdir[256];

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pippin-ckpt-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

/* The MLP fixture split at its markers, training, with AdamW. */
static pp_runner *mlp_runner(pp_pipe **p_out) {
    pp_graph *g = tu_fixture_onnx("mlp", "model.onnx");
    TU_OK(pp_pipe_split(g, NULL, p_out));
    pp_graph_free(g);
    pp_runner *r;
    TU_OK(pp_runner_new(*p_out, 1, &r));
    pp_optim_config oc;
    pp_optim_config_init(&oc, PP_OPTIM_ADAMW);
    TU_OK(pp_runner_set_optimizer(r, &oc));
    return r;
}

/* Every parameter and optimizer element of stage st set from seed. */
static void fill_stage(pp_runner *r, int st, float seed) {
    pp_flat_params *fp = pp_stage_params(pp_runner_stage(r, st));
    for (int64_t i = 0; i < fp->total; i++) fp->data[i] = seed + (float)i * 0.25f;
    pp_optim *o = pp_runner_optimizer(r, st);
    for (int b = 0; b < pp_optim_state(o, -1, NULL, NULL); b++) {
        const char *name;
        float *buf;
        pp_optim_state(o, b, &name, &buf);
        for (int64_t i = 0; i < fp->total; i++) buf[i] = seed * (float)(b + 2) - (float)i;
    }
}

static int stage_is(pp_runner *r, int st, float seed) {
    pp_flat_params *fp = pp_stage_params(pp_runner_stage(r, st));
    int same = 1;
    for (int k = 0; k < fp->n; k++) /* the parameters, not the padding between them */
        for (int64_t i = fp->offset[k]; i < fp->offset[k] + fp->numel[k]; i++) same &= fp->data[i] == seed + (float)i * 0.25f;
    pp_optim *o = pp_runner_optimizer(r, st);
    for (int b = 0; b < pp_optim_state(o, -1, NULL, NULL); b++) {
        const char *name;
        float *buf;
        pp_optim_state(o, b, &name, &buf);
        for (int64_t i = 0; i < fp->total; i++) same &= buf[i] == seed * (float)(b + 2) - (float)i;
    }
    return same;
}

static void test_round_trip_in_place(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = mlp_runner(&p);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/round", tmpdir);
    for (int s = 0; s < pp_runner_n_stages(r); s++) {
        fill_stage(r, s, 1.5f + (float)s);
        TU_OK(pp_checkpoint_save_stage(dir, 3, pp_runner_stage(r, s), pp_runner_optimizer(r, s)));
        fill_stage(r, s, -7.0f); /* scribbled over, then restored */
        assert_false(stage_is(r, s, 1.5f + (float)s));
        TU_OK(pp_checkpoint_load_stage(dir, 3, pp_runner_stage(r, s), pp_runner_optimizer(r, s)));
        assert_true(stage_is(r, s, 1.5f + (float)s));
    }
    pp_runner_free(r);
    pp_pipe_free(p);
}

/* A file of another step (its header says so) is refused before anything
 * is read into the stage. */
static void test_header_refusal_leaves_stage(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = mlp_runner(&p);
    char dir[300], from[400], to[400];
    snprintf(dir, sizeof dir, "%s/refused", tmpdir);
    fill_stage(r, 0, 2.0f);
    TU_OK(pp_checkpoint_save_stage(dir, 1, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)));
    snprintf(from, sizeof from, "%s/step_2", dir);
    assert_int_equal(mkdir(from, 0777), 0);
    pp_checkpoint_stage_path(dir, 1, 0, from, sizeof from);
    pp_checkpoint_stage_path(dir, 2, 0, to, sizeof to);
    assert_int_equal(rename(from, to), 0);
    fill_stage(r, 0, 9.0f);
    assert_int_equal(pp_checkpoint_load_stage(dir, 2, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "pippin.step is '1', expected '2'"));
    assert_true(stage_is(r, 0, 9.0f));
    pp_runner_free(r);
    pp_pipe_free(p);
}

static void cut_file(const char *path, off_t keep) { assert_int_equal(truncate(path, keep), 0); }

/* Another process cutting the file once its header has been read (the
 * loader logs that at debug level): the first tensor past the new end
 * comes back short. */
static void truncate_after_header(pp_log_level level, const char *msg, void *user) {
    (void)level;
    if (!strstr(msg, "header read")) return;
    struct stat st;
    if (stat(user, &st) == 0) cut_file(user, st.st_size - 8);
}

static void test_truncated_while_loading(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = mlp_runner(&p);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/cut", tmpdir);
    fill_stage(r, 0, 3.0f);
    TU_OK(pp_checkpoint_save_stage(dir, 5, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)));
    pp_checkpoint_stage_path(dir, 5, 0, path, sizeof path);
    pp_log_set_level(PP_LOG_DEBUG);
    pp_log_set_handler(truncate_after_header, path);
    pp_status s = pp_checkpoint_load_stage(dir, 5, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0));
    pp_log_set_handler(NULL, NULL);
    pp_log_set_level(PP_LOG_ERROR);
    assert_int_equal(s, PP_ERR_IO);
    const char *e = pp_last_error();
    if (!strstr(e, path) || !strstr(e, "tensor '") || !strstr(e, "bytes at offset") || !strstr(e, "shorter than when it was opened") ||
        !strstr(e, "partly overwritten"))
        fail_msg("unexpected error: %s", e);
    /* and a file cut before the load: its header's offsets pass the end */
    TU_OK(pp_checkpoint_save_stage(dir, 6, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)));
    pp_checkpoint_stage_path(dir, 6, 0, path, sizeof path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    cut_file(path, st.st_size - 4);
    assert_int_equal(pp_checkpoint_load_stage(dir, 6, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)), PP_ERR_PARSE);
    if (!strstr(pp_last_error(), path) || !strstr(pp_last_error(), "tensor '"))
        fail_msg("unexpected error: %s", pp_last_error());
    pp_runner_free(r);
    pp_pipe_free(p);
}

/* A flipped byte in a tensor: the hash, computed as the tensors arrive,
 * tells. */
static void test_damaged_refused(void **state) {
    (void)state;
    pp_pipe *p;
    pp_runner *r = mlp_runner(&p);
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/damaged", tmpdir);
    fill_stage(r, 0, 4.0f);
    TU_OK(pp_checkpoint_save_stage(dir, 1, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)));
    pp_checkpoint_stage_path(dir, 1, 0, path, sizeof path);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
    assert_int_equal(pp_checkpoint_load_stage(dir, 1, pp_runner_stage(r, 0), pp_runner_optimizer(r, 0)), PP_ERR_INVALID);
    if (!strstr(pp_last_error(), path) || !strstr(pp_last_error(), "damaged"))
        fail_msg("unexpected error: %s", pp_last_error());
    pp_runner_free(r);
    pp_pipe_free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_in_place),
        cmocka_unit_test(test_header_refusal_leaves_stage),
        cmocka_unit_test(test_truncated_while_loading),
        cmocka_unit_test(test_damaged_refused),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, setup, teardown);
}
