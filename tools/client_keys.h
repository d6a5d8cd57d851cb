/* The client commands' CURVE options (pippin request, pippin generate):
 * --server-key FILE.pub (the front rank's public key) and --key PREFIX (this
 * client's pair, PREFIX.key and PREFIX.pub from `pippin keygen`), both or
 * neither (docs/serving.md "Security"). */
#ifndef PIPPIN_TOOLS_CLIENT_KEYS_H
#define PIPPIN_TOOLS_CLIENT_KEYS_H

#include <stdio.h>
#include <string.h>

#include "pippin/client.h"
#include "pippin/transport.h"

typedef struct pp_cli_keys {
    char server[PP_CURVE_KEY_CHARS + 1], pub[PP_CURVE_KEY_CHARS + 1], sec[PP_CURVE_KEY_CHARS + 1];
} pp_cli_keys;

/* Fills o's keys from the files; 0 when neither option is given, 1 after
 * printing an error (a read failure), 2 after a usage error. */
static inline int pp_cli_read_keys(const char *cmd, const char *server_file, const char *prefix, pp_cli_keys *k,
                                   pp_client_options *o) {
    if (!server_file && !prefix) return 0;
    if (!server_file || !prefix) {
        fprintf(stderr, "pippin %s: --server-key and --key go together (CURVE: the front's public key and this "
                        "client's key pair)\n", cmd);
        return 2;
    }
    char path[4096];
    if (pp_curve_read_key(server_file, k->server) != PP_OK) goto fail;
    if (snprintf(path, sizeof path, "%s.key", prefix) >= (int)sizeof path) {
        fprintf(stderr, "pippin %s: --key '%s': too long\n", cmd, prefix);
        return 2;
    }
    if (pp_curve_read_key(path, k->sec) != PP_OK) goto fail;
    snprintf(path, sizeof path, "%s.pub", prefix);
    if (pp_curve_read_key(path, k->pub) != PP_OK) goto fail;
    char derived[PP_CURVE_KEY_CHARS + 1];
    if (pp_curve_public_key(k->sec, derived) != PP_OK) goto fail;
    if (strcmp(derived, k->pub) != 0) {
        fprintf(stderr, "pippin %s: --key %s: %s.pub is not the public key of %s.key\n", cmd, prefix, prefix, prefix);
        return 1;
    }
    o->server_key = k->server;
    o->public_key = k->pub;
    o->secret_key = k->sec;
    return 0;
fail:
    fprintf(stderr, "pippin %s: %s\n", cmd, pp_last_error());
    return 1;
}

#endif
