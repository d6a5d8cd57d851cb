/* Optimizers: three training steps of every fixture with SGD (momentum,
 * weight decay), SGD with nesterov and AdamW reproduce torch.optim's losses
 * (train_ref.json) and, for the MLP, its parameters; the update rules
 * element by element against a double-precision reference; bad settings;
 * the same bits on 1 and on 4 threads over a large flat buffer. */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#include "test_filter.h"
#include "pippin/exec.h"
static double jnum(json_object *o, const char *key) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v)) fail_msg("no key '%s'", key);
    return json_object_get_double(v);
}

/* torch hyperparameters from train_ref.json into a config. */
static void config_from_json(json_object *entry, pp_optim_config *c) {
    json_object *hp, *cls, *v;
    assert_true(json_object_object_get_ex(entry, "hyperparameters", &hp));
    assert_true(json_object_object_get_ex(entry, "optimizer", &cls));
    int adamw = strcmp(json_object_get_string(cls), "AdamW") == 0;
    pp_optim_config_init(c, adamw ? PP_OPTIM_ADAMW : PP_OPTIM_SGD);
    c->lr = jnum(hp, "lr");
    c->weight_decay = jnum(hp, "weight_decay");
    if (adamw) {
        assert_true(json_object_object_get_ex(hp, "betas", &v));
        c->beta1 = json_object_get_double(json_object_array_get_idx(v, 0));
        c->beta2 = json_object_get_double(json_object_array_get_idx(v, 1));
        c->eps = jnum(hp, "eps");
    } else {
        c->momentum = jnum(hp, "momentum");
        c->dampening = jnum(hp, "dampening");
        assert_true(json_object_object_get_ex(hp, "nesterov", &v));
        c->nesterov = json_object_get_boolean(v);
    }
}

typedef struct run {
    pp_graph *g;
    pp_trainer *t;
    pp_optim *o;
    int n_in;
    pp_tensor *data[8];
} run;

static void run_open(run *r, const char *model, const pp_optim_config *c) {
    char rel[512];
    snprintf(rel, sizeof rel, "test/fixtures/%s/model.onnx", model);
    TU_OK(pp_onnx_load(tu_src_path(rel), &r->g));
    TU_OK(pp_trainer_new(r->g, NULL, &r->t));
    TU_OK(pp_optim_new(c, pp_trainer_params(r->t)->total, &r->o));
    r->n_in = pp_trainer_n_inputs(r->t);
    for (int i = 0; i < r->n_in; i++) {
        snprintf(rel, sizeof rel, "test/fixtures/%s/train_%s.npy", model,
                 r->g->values[r->g->inputs[i]].name);
        TU_OK(pp_npy_load(tu_src_path(rel), &r->data[i]));
    }
}

/* Loss of batch `step` with the current parameters; with update, also the
 * optimizer step on its gradient. */
static float run_step(run *r, int64_t step, int64_t batch, int update) {
    pp_tensor *ins[8];
    for (int i = 0; i < r->n_in; i++) TU_OK(pp_data_batch(r->data[i], step, batch, &ins[i]));
    pp_flat_params *fp = pp_trainer_params(r->t);
    pp_flat_params_zero_grad(fp);
    float loss;
    TU_OK(pp_trainer_backward(r->t, ins, 1.0f, &loss));
    if (update) TU_OK(pp_optim_step(r->o, fp->data, fp->grad, fp->total));
    for (int i = 0; i < r->n_in; i++) pp_tensor_free(ins[i]);
    return loss;
}

static void run_close(run *r) {
    for (int i = 0; i < r->n_in; i++) pp_tensor_free(r->data[i]);
    pp_optim_free(r->o);
    pp_trainer_free(r->t);
    pp_graph_free(r->g);
}

static void check_trajectories(const char *model) {
    char rel[512];
    snprintf(rel, sizeof rel, "test/fixtures/%s/train_ref.json", model);
    json_object *ref = json_object_from_file(tu_src_path(rel));
    assert_non_null(ref);
    int64_t batch = (int64_t)jnum(ref, "batch_size"), steps = (int64_t)jnum(ref, "steps");
    json_object *opts;
    assert_true(json_object_object_get_ex(ref, "optimizers", &opts));
    json_object_object_foreach(opts, name, entry) {
        pp_optim_config c;
        config_from_json(entry, &c);
        run r = {0};
        run_open(&r, model, &c);
        json_object *losses, *after;
        assert_true(json_object_object_get_ex(entry, "losses", &losses));
        double worst = 0;
        for (int64_t s = 0; s < steps; s++) {
            double want = json_object_get_double(json_object_array_get_idx(losses, (size_t)s));
            double got = run_step(&r, s, batch, 1);
            if (fabs(got - want) > worst) worst = fabs(got - want);
            if (fabs(got - want) > 1e-4)
                fail_msg("%s %s step %lld: loss %.7f, torch %.7f", model, name, (long long)s, got,
                         want);
        }
        double want_after = jnum(entry, "loss_after");
        double got_after = run_step(&r, steps, batch, 0);
        if (fabs(got_after - want_after) > 1e-4)
            fail_msg("%s %s loss after: %.7f, torch %.7f", model, name, got_after, want_after);
        print_message("# %s %s: losses within %.2g of torch, after %d steps %.7f (torch %.7f)\n",
                      model, name, worst, (int)steps, got_after, want_after);
        if (json_object_object_get_ex(entry, "params_after", &after)) {
            pp_flat_params *fp = pp_trainer_params(r.t);
            json_object_object_foreach(after, pname, file) {
                snprintf(rel, sizeof rel, "test/fixtures/%s/%s", model, json_object_get_string(file));
                pp_tensor *want, *got;
                TU_OK(pp_npy_load(tu_src_path(rel), &want));
                int i = pp_flat_params_find(fp, pname);
                assert_true(i >= 0);
                TU_OK(pp_flat_params_data_view(fp, i, &got));
                tu_assert_close(got, want, 1e-4, 1e-5, pname);
                pp_tensor_free(want);
                pp_tensor_free(got);
            }
        }
        run_close(&r);
    }
    json_object_put(ref);
}

static void test_mlp_trajectories(void **state) {
    (void)state;
    check_trajectories("mlp");
}

static void test_skip_trajectories(void **state) {
    (void)state;
    check_trajectories("skip");
}

/* Regression: buffers and a frozen parameter stay put (AdamW's weight decay
 * and momentum would move them if they were trained). */
static void test_buffer_trajectories(void **state) {
    (void)state;
    check_trajectories("buffer");
}

static void test_gpt_trajectories(void **state) {
    (void)state;
    check_trajectories("gpt");
}

/* ------------------------------------------------------------------------ */
/* Element-wise rules in double precision, for settings the fixtures do not
 * cover (dampening, maximize, no momentum). */

static void reference(const pp_optim_config *c, int steps, const double *g0, double *p, int n) {
    double buf[8] = {0}, m[8] = {0}, v[8] = {0};
    for (int t = 1; t <= steps; t++)
        for (int i = 0; i < n; i++) {
            double g = g0[i] * t * (c->maximize ? -1 : 1);
            if (c->kind == PP_OPTIM_SGD) {
                g += c->weight_decay * p[i];
                if (c->momentum != 0) {
                    buf[i] = t == 1 ? g : c->momentum * buf[i] + (1 - c->dampening) * g;
                    g = c->nesterov ? g + c->momentum * buf[i] : buf[i];
                }
                p[i] -= c->lr * g;
            } else {
                p[i] *= 1 - c->lr * c->weight_decay;
                m[i] = c->beta1 * m[i] + (1 - c->beta1) * g;
                v[i] = c->beta2 * v[i] + (1 - c->beta2) * g * g;
                double mh = m[i] / (1 - pow(c->beta1, t)), vh = v[i] / (1 - pow(c->beta2, t));
                p[i] -= c->lr * mh / (sqrt(vh) + c->eps);
            }
        }
}

static void check_rule(const pp_optim_config *c) {
    const double g0[5] = {0.5, -1.25, 2.0, 0.0, -0.01};
    double want[5] = {1.0, -2.0, 0.25, 3.0, -0.5};
    float p[5], grad[5];
    for (int i = 0; i < 5; i++) p[i] = (float)want[i];
    pp_optim *o;
    TU_OK(pp_optim_new(c, 5, &o));
    for (int t = 1; t <= 4; t++) {
        for (int i = 0; i < 5; i++) grad[i] = (float)(g0[i] * t);
        TU_OK(pp_optim_step(o, p, grad, 5));
    }
    assert_int_equal(pp_optim_steps(o), 4);
    reference(c, 4, g0, want, 5);
    for (int i = 0; i < 5; i++) assert_float_equal(p[i], want[i], 1e-5 * (1 + fabs(want[i])));
    pp_optim_free(o);
}

static void test_update_rules(void **state) {
    (void)state;
    pp_optim_config c;
    pp_optim_config_init(&c, PP_OPTIM_SGD);
    c.lr = 0.1;
    check_rule(&c); /* plain */
    c.momentum = 0.9;
    c.dampening = 0.3;
    c.weight_decay = 0.05;
    check_rule(&c);
    c.maximize = 1;
    check_rule(&c);
    c.dampening = 0;
    c.nesterov = 1;
    check_rule(&c);
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    c.lr = 0.05;
    check_rule(&c);
    c.weight_decay = 0;
    c.beta1 = 0.5;
    c.beta2 = 0.9;
    c.eps = 1e-3;
    c.maximize = 1;
    check_rule(&c);
}

static void test_state_and_lr(void **state) {
    (void)state;
    pp_optim_config c;
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    pp_optim *o;
    TU_OK(pp_optim_new(&c, 3, &o));
    const char *name;
    float *buf;
    assert_int_equal(pp_optim_state(o, 1, &name, &buf), 2);
    assert_string_equal(name, "exp_avg_sq");
    assert_non_null(buf);
    pp_optim_set_lr(o, 0.5);
    assert_true(pp_optim_get_config(o)->lr == 0.5);
    float p[3] = {1, 1, 1}, g[3] = {1, 1, 1};
    assert_int_equal(pp_optim_step(o, p, g, 4), PP_ERR_INVALID);
    pp_optim_free(o);
    pp_optim_config_init(&c, PP_OPTIM_SGD);
    TU_OK(pp_optim_new(&c, 3, &o));
    assert_int_equal(pp_optim_state(o, 0, NULL, NULL), 0); /* no momentum: no state */
    pp_optim_free(o);
    pp_optim_kind k;
    TU_OK(pp_optim_kind_parse("AdamW", &k));
    assert_int_equal(k, PP_OPTIM_ADAMW);
    assert_int_equal(pp_optim_kind_parse("adam", &k), PP_ERR_INVALID);
}

static void test_bad_settings(void **state) {
    (void)state;
    pp_optim_config c;
    pp_optim *o = NULL;
    pp_optim_config_init(&c, PP_OPTIM_SGD);
    c.nesterov = 1;
    assert_int_equal(pp_optim_new(&c, 3, &o), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "nesterov"));
    c.momentum = 0.9;
    c.dampening = 0.1;
    assert_int_equal(pp_optim_new(&c, 3, &o), PP_ERR_INVALID);
    pp_optim_config_init(&c, PP_OPTIM_SGD);
    c.lr = -1;
    assert_int_equal(pp_optim_new(&c, 3, &o), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "learning rate"));
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    c.beta2 = 1.0;
    assert_int_equal(pp_optim_new(&c, 3, &o), PP_ERR_INVALID);
    assert_non_null(strstr(pp_last_error(), "beta2"));
    assert_null(o);
    /* A count whose byte size wraps around is refused, not given a tiny
     * state buffer that every step would overrun. */
    pp_optim_config_init(&c, PP_OPTIM_ADAMW);
    assert_int_equal(pp_optim_new(&c, INT64_C(1) << 62, &o), PP_ERR_INVALID);
    assert_null(o);
}

/* Three steps over n parameters on the given thread count. */
static float *steps_on(const pp_optim_config *c, int threads, int64_t n) {
    pp_set_threads(threads);
    float *p = malloc(sizeof(float) * (size_t)n), *g = malloc(sizeof(float) * (size_t)n);
    assert_non_null(p);
    assert_non_null(g);
    uint64_t s = 5;
    for (int64_t i = 0; i < n; i++) p[i] = (float)(tu_urand(&s) - 0.5);
    pp_optim *o;
    TU_OK(pp_optim_new(c, n, &o));
    for (int step = 0; step < 3; step++) {
        for (int64_t i = 0; i < n; i++) g[i] = (float)(tu_urand(&s) - 0.5) * (float)(step + 1);
        TU_OK(pp_optim_step(o, p, g, n));
    }
    pp_optim_free(o);
    free(g);
    pp_set_threads(1);
    return p;
}

static void test_threads_same_bits(void **state) {
    (void)state;
    const int64_t n = 300007;
    pp_optim_config cs[3];
    pp_optim_config_init(&cs[0], PP_OPTIM_SGD);
    cs[0].momentum = 0.9;
    cs[0].weight_decay = 0.01;
    pp_optim_config_init(&cs[1], PP_OPTIM_SGD);
    cs[1].momentum = 0.9;
    cs[1].nesterov = 1;
    pp_optim_config_init(&cs[2], PP_OPTIM_ADAMW);
    for (int k = 0; k < 3; k++) {
        float *a = steps_on(&cs[k], 1, n), *b = steps_on(&cs[k], 4, n);
        assert_memory_equal(a, b, sizeof(float) * (size_t)n);
        free(a);
        free(b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads_same_bits),
        cmocka_unit_test(test_mlp_trajectories),
        cmocka_unit_test(test_skip_trajectories),
        cmocka_unit_test(test_gpt_trajectories),
        cmocka_unit_test(test_buffer_trajectories),
        cmocka_unit_test(test_update_rules),
        cmocka_unit_test(test_state_and_lr),
        cmocka_unit_test(test_bad_settings),
    };
    tu_filter_from_env();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
