/* pippin keygen: make a CURVE key pair for encrypted links. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "pippin/transport.h"

static void keygen_usage(FILE *f) {
    fprintf(f,
            "usage: pippin keygen [-f] -o PREFIX\n"
            "\n"
            "Makes a CURVE key pair for encrypted links and writes PREFIX.key (the\n"
            "secret key, mode 0600: keep it where it is used) and PREFIX.pub (the\n"
            "public key: give it to the other side). A rank's pair encrypts its links\n"
            "(security: in the config; every rank gets every .pub); a serving\n"
            "client's pair lets it in (its .pub in serve.client_keys; it connects\n"
            "with --server-key RANK0.pub --key PREFIX). Both files hold the key as 40\n"
            "characters of Z85 text after a '#' comment line.\n"
            "\n"
            "  -o, --output PREFIX  path and base name of the two files\n"
            "  -f, --force          overwrite existing files\n"
            "  -h, --help           show this help\n");
}

int cmd_keygen(int argc, char **argv) {
    const char *prefix = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            keygen_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "pippin keygen: %s needs a path prefix\n", a);
                return 2;
            }
            prefix = argv[++i];
        } else if (!strncmp(a, "--output=", 9)) {
            prefix = a + 9;
        } else {
            fprintf(stderr, "pippin keygen: unexpected argument '%s'\n", a);
            keygen_usage(stderr);
            return 2;
        }
    }
    if (!prefix || !prefix[0]) {
        keygen_usage(stderr);
        return 2;
    }
    char pub[PP_CURVE_KEY_CHARS + 1];
    if (pp_curve_write_keypair(prefix, force, pub) != PP_OK) return pp_cli_fail("keygen");
    printf("wrote %s.key (secret) and %s.pub (public key %s)\n", prefix, prefix, pub);
    return 0;
}
