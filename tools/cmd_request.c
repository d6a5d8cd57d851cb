/* pippin request: one request to a serving pipeline's front endpoint
 * (mode: serve), for scripts and tests. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_keys.h"
#include "cli_util.h"
#include "commands.h"
#include "pippin/client.h"
#include "pippin/npy.h"
#include "pippin/status.h"

#define MAX_ARGS 64

static void request_usage(FILE *f) {
    fprintf(f, "usage: pippin request ENDPOINT --input NAME=FILE.npy ... [--output NAME ...]\n"
               "                      [--output-dir DIR] [--timeout-ms T] [--session ID]\n"
               "                      [--server-key FILE.pub --key PREFIX]\n"
               "       pippin request ENDPOINT --stats [--server-key FILE.pub --key PREFIX]\n"
               "       pippin request ENDPOINT --end-session ID [--server-key FILE.pub --key PREFIX]\n"
               "Sends one request to a serving pipeline (a config with mode: serve) and writes\n"
               "each output it gets back as DIR/<name>.npy (default: the current directory).\n"
               "--output picks outputs (default: all). --timeout-ms (default 10000) bounds the\n"
               "service's work and this wait. --stats prints the service's counters as JSON.\n"
               "--session keeps the model's state (a KV cache) on its stages for the next\n"
               "request of session ID; --end-session drops it.\n"
               "--server-key (the front rank's .pub) and --key (this client's PREFIX.key and\n"
               "PREFIX.pub from pippin keygen) talk CURVE to a service whose config has\n"
               "security: (the client's .pub must be in its serve.client_keys); a refused key\n"
               "gets no answer, so the request ends at --timeout-ms.\n"
               "Exit status: 0 on success; 1 with the service's error (bad request, busy,\n"
               "timeout, failed, unavailable, session lost) or when no answer came; 2 for a\n"
               "usage error.\n");
}

int cmd_request(int argc, char **argv) {
    static const struct option opts[] = {{"input", required_argument, NULL, 'i'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"output-dir", required_argument, NULL, 'd'},
                                         {"timeout-ms", required_argument, NULL, 't'},
                                         {"stats", no_argument, NULL, 's'},
                                         {"session", required_argument, NULL, 'S'},
                                         {"end-session", required_argument, NULL, 'E'},
                                         {"server-key", required_argument, NULL, 'K'},
                                         {"key", required_argument, NULL, 'k'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *in_names[MAX_ARGS], *in_files[MAX_ARGS], *outs[MAX_ARGS], *dir = ".", *session = NULL, *end = NULL,
               *server_key = NULL, *key = NULL;
    int n_in = 0, n_out = 0, stats = 0, c;
    long timeout = 10000;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'i') {
            char *eq = strchr(optarg, '=');
            if (!eq || eq == optarg || !eq[1] || n_in == MAX_ARGS) {
                fprintf(stderr, "pippin request: --input '%s': expected NAME=FILE.npy (at most %d)\n", optarg, MAX_ARGS);
                return 2;
            }
            *eq = 0;
            in_names[n_in] = optarg;
            in_files[n_in++] = eq + 1;
        } else if (c == 'o') {
            if (n_out == MAX_ARGS) return 2;
            outs[n_out++] = optarg;
        } else if (c == 'd') {
            dir = optarg;
        } else if (c == 't') {
            char *end;
            timeout = strtol(optarg, &end, 10);
            if (*end || end == optarg || timeout < 1 || timeout > 3600000) {
                fprintf(stderr, "pippin request: --timeout-ms '%s': need 1 to 3600000\n", optarg);
                return 2;
            }
        } else if (c == 's') {
            stats = 1;
        } else if (c == 'S') {
            session = optarg;
        } else if (c == 'E') {
            end = optarg;
        } else if (c == 'K') {
            server_key = optarg;
        } else if (c == 'k') {
            key = optarg;
        } else if (c == 'h') {
            request_usage(stdout);
            return 0;
        } else {
            request_usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || (!stats && !end && n_in == 0)) {
        request_usage(stderr);
        return 2;
    }
    pp_client_options co;
    pp_client_options_init(&co);
    pp_cli_keys keys;
    int krc = pp_cli_read_keys("request", server_key, key, &keys, &co);
    if (krc) {
        if (krc == 2) request_usage(stderr);
        return krc;
    }
    pp_tensor *ins[MAX_ARGS] = {0};
    for (int i = 0; i < n_in; i++)
        if (pp_npy_load(in_files[i], &ins[i]) != PP_OK) {
            for (int k = 0; k < i; k++) pp_tensor_free(ins[k]);
            return pp_cli_fail("request");
        }
    pp_client *cl = NULL;
    uint64_t id = 0;
    pp_status s = pp_client_connect(argv[optind], &co, &cl);
    if (s == PP_OK)
        s = stats ? pp_client_submit_stats(cl, &id)
            : end ? pp_client_end_session(cl, end, &id)
                  : pp_client_submit_session(cl, session, n_in, in_names, ins, n_out, outs, (uint32_t)timeout, &id);
    pp_response *r = NULL;
    if (s == PP_OK) s = pp_client_wait(cl, id, (int)timeout + 1000, &r);
    int rc = 0;
    if (s != PP_OK) {
        rc = pp_cli_fail("request");
    } else if (r->code != PP_SERVE_OK) {
        fprintf(stderr, "pippin request: %s: %s\n", pp_serve_code_name(r->code), r->error);
        rc = 1;
    } else if (stats) {
        printf("%s\n", r->stats ? r->stats : "{}");
    } else if (r->n_outputs && pp_mkdirs(dir) != PP_OK) {
        rc = pp_cli_fail("request");
    } else {
        for (int o = 0; o < r->n_outputs && rc == 0; o++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.npy", dir, r->names[o]);
            for (char *p = path + strlen(dir) + 1; *p; p++)
                if (*p == '/') *p = '_'; /* an output name is one file name */
            if (pp_npy_save(path, r->outputs[o]) != PP_OK) rc = pp_cli_fail("request");
            else printf("%s\n", path);
        }
    }
    pp_response_free(r);
    pp_client_close(cl);
    for (int i = 0; i < n_in; i++) pp_tensor_free(ins[i]);
    memset(&keys, 0, sizeof keys);
    return rc;
}
