/* pippin generate: text or tokens from a serving pipeline's generation loop
 * (mode: serve with a causal language model), printed as they arrive. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_keys.h"
#include "commands.h"
#include "pippin/client.h"
#include "pippin/npy.h"
#include "pippin/status.h"

#define MAX_STOP 64

static void generate_usage(FILE *f) {
    fprintf(f, "usage: pippin generate ENDPOINT (--prompt TEXT | --tokens FILE.npy) [--max-tokens N]\n"
               "                       [--temperature T] [--top-k K] [--seed S] [--stop TOKEN]...\n"
               "                       [--session ID] [--timeout-ms T] [--tokens-out]\n"
               "                       [--server-key FILE.pub --key PREFIX]\n"
               "Asks a serving pipeline to continue a prompt (text in the service's serve.vocab,\n"
               "or int64 tokens [1, T]) and prints what it produces as it arrives: the text when\n"
               "the service has a vocabulary, else (or with --tokens-out) one token id per line.\n"
               "Greedy unless --temperature > 0 (then sampled among the --top-k most likely,\n"
               "reproducibly for a --seed). --stop ends at a token (printed). --max-tokens\n"
               "defaults to 16. With --session the model's state stays on its stages, so the\n"
               "next generate on that session continues the conversation. --timeout-ms (default\n"
               "10000) bounds each token. --server-key (the front rank's .pub) and --key (this\n"
               "client's PREFIX.key and PREFIX.pub from pippin keygen) talk CURVE to a service\n"
               "whose config has security: (the client's .pub in its serve.client_keys).\n"
               "Exit status: 0 on success; 1 with the service's error; 2 for a usage error.\n");
}

static int number(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    *out = strtod(s, &end);
    if (end == s || *end || *out < lo || *out > hi) {
        fprintf(stderr, "pippin generate: %s '%s': need a number from %g to %g\n", opt, s, lo, hi);
        return -1;
    }
    return 0;
}

int cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {{"prompt", required_argument, NULL, 'p'},
                                         {"tokens", required_argument, NULL, 'k'},
                                         {"max-tokens", required_argument, NULL, 'n'},
                                         {"temperature", required_argument, NULL, 'T'},
                                         {"top-k", required_argument, NULL, 'K'},
                                         {"seed", required_argument, NULL, 'S'},
                                         {"stop", required_argument, NULL, 'x'},
                                         {"session", required_argument, NULL, 's'},
                                         {"timeout-ms", required_argument, NULL, 't'},
                                         {"tokens-out", no_argument, NULL, 'o'},
                                         {"server-key", required_argument, NULL, 'V'},
                                         {"key", required_argument, NULL, 'y'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *prompt = NULL, *tokens_file = NULL, *server_key = NULL, *key = NULL;
    int64_t stop[MAX_STOP];
    pp_generate_options g;
    pp_generate_options_init(&g);
    double timeout = 10000, x;
    int c, ids_out = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p': prompt = optarg; break;
        case 'k': tokens_file = optarg; break;
        case 'n':
            if (number("--max-tokens", optarg, 1, 1 << 20, &x)) return 2;
            g.max_tokens = (uint32_t)x;
            break;
        case 'T':
            if (number("--temperature", optarg, 0, 1e6, &x)) return 2;
            g.temperature = (float)x;
            break;
        case 'K':
            if (number("--top-k", optarg, 0, 1 << 30, &x)) return 2;
            g.top_k = (uint32_t)x;
            break;
        case 'S':
            if (number("--seed", optarg, 0, 1.8e19, &x)) return 2;
            g.seed = (uint64_t)x;
            break;
        case 'x':
            if (g.n_stop == MAX_STOP || number("--stop", optarg, 0, 9e15, &x)) return 2;
            stop[g.n_stop++] = (int64_t)x;
            break;
        case 's': g.session = optarg; break;
        case 't':
            if (number("--timeout-ms", optarg, 1, 3600000, &timeout)) return 2;
            break;
        case 'o': ids_out = 1; break;
        case 'V': server_key = optarg; break;
        case 'y': key = optarg; break;
        case 'h': generate_usage(stdout); return 0;
        default: generate_usage(stderr); return 2;
        }
    }
    if (optind != argc - 1 || !prompt == !tokens_file) {
        generate_usage(stderr);
        return 2;
    }
    g.stop = stop;
    g.timeout_ms = (uint32_t)timeout;
    pp_client_options co;
    pp_client_options_init(&co);
    pp_cli_keys keys;
    int krc = pp_cli_read_keys("generate", server_key, key, &keys, &co);
    if (krc) {
        if (krc == 2) generate_usage(stderr);
        return krc;
    }
    pp_tensor *toks = NULL;
    if (tokens_file && pp_npy_load(tokens_file, &toks) != PP_OK) return pp_cli_fail("generate");
    pp_client *cl = NULL;
    uint64_t id = 0;
    pp_status s = pp_client_connect(argv[optind], &co, &cl);
    if (s == PP_OK) s = pp_client_submit_generate(cl, toks, prompt, &g, &id);
    int rc = 0, more = 1;
    while (s == PP_OK && more && rc == 0) {
        pp_response *r = NULL;
        s = pp_client_wait(cl, id, (int)timeout + 1000, &r);
        if (s != PP_OK) break;
        more = r->more;
        if (r->code != PP_SERVE_OK) {
            fflush(stdout);
            fprintf(stderr, "pippin generate: %s: %s\n", pp_serve_code_name(r->code), r->error);
            rc = 1;
        } else if (r->text && !ids_out) {
            fputs(r->text, stdout);
        } else {
            for (int i = 0; i < r->n_tokens; i++) printf("%lld\n", (long long)r->tokens[i]);
        }
        fflush(stdout);
        pp_response_free(r);
    }
    if (s != PP_OK) rc = pp_cli_fail("generate");
    else if (rc == 0 && prompt && !ids_out) printf("\n");
    pp_client_close(cl);
    pp_tensor_free(toks);
    memset(&keys, 0, sizeof keys);
    return rc;
}
