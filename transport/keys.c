/* CURVE key pairs and key files (Z85 text, one key per file). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "pippin/log.h"
#include "pippin/transport.h"

#include "status_internal.h"
#include "log_internal.h"
static const char z85_chars[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

int pp_curve_key_valid(const char *s) {
    if (!s || strlen(s) != PP_CURVE_KEY_CHARS) return 0;
    for (const char *p = s; *p; p++)
        if (!strchr(z85_chars, *p)) return 0;
    uint8_t raw[32];
    return zmq_z85_decode(raw, s) != NULL;
}

static pp_status need_curve(void) {
    if (!zmq_has("curve"))
        return pp_error(PP_ERR_UNSUPPORTED, "this libzmq was built without CURVE (libsodium)");
    return PP_OK;
}

pp_status pp_curve_keypair(char public_z85[PP_CURVE_KEY_CHARS + 1],
                           char secret_z85[PP_CURVE_KEY_CHARS + 1]) {
    PP_TRY(need_curve());
    if (zmq_curve_keypair(public_z85, secret_z85) != 0)
        return pp_error(PP_ERR_IO, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    return PP_OK;
}

pp_status pp_curve_public_key(const char *secret_z85, char public_z85[PP_CURVE_KEY_CHARS + 1]) {
    PP_TRY(need_curve());
    if (!pp_curve_key_valid(secret_z85))
        return pp_error(PP_ERR_INVALID, "a CURVE secret key must be 40 characters of Z85 text");
    if (zmq_curve_public(public_z85, secret_z85) != 0)
        return pp_error(PP_ERR_IO, "zmq_curve_public: %s", zmq_strerror(zmq_errno()));
    return PP_OK;
}

static pp_status write_file(const char *path, const char *text, mode_t mode, int overwrite) {
    int flags = O_WRONLY | O_CREAT | (overwrite ? O_TRUNC : O_EXCL);
    int fd = open(path, flags, mode);
    if (fd < 0)
        return pp_error(PP_ERR_IO, "%s: %s%s", path, strerror(errno),
                        errno == EEXIST ? " (use --force to overwrite)" : "");
    if (overwrite) fchmod(fd, mode);
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return pp_error(PP_ERR_IO, "%s: %s", path, strerror(e));
        }
        off += (size_t)w;
    }
    if (close(fd) != 0) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    return PP_OK;
}

pp_status pp_curve_write_keypair(const char *prefix, int overwrite,
                                 char public_z85[PP_CURVE_KEY_CHARS + 1]) {
    char pub[PP_CURVE_KEY_CHARS + 1], sec[PP_CURVE_KEY_CHARS + 1];
    PP_TRY(pp_curve_keypair(pub, sec));
    char path[4096], text[256];
    if (snprintf(path, sizeof path, "%s.key", prefix) >= (int)sizeof path)
        return pp_error(PP_ERR_INVALID, "key file prefix too long");
    snprintf(text, sizeof text,
             "# pippin CURVE secret key (Z85). Keep it private; its public key is in %s.pub\n%s\n",
             strrchr(prefix, '/') ? strrchr(prefix, '/') + 1 : prefix, sec);
    PP_TRY(write_file(path, text, 0600, overwrite));
    memset(sec, 0, sizeof sec);
    memset(text, 0, sizeof text);
    snprintf(path, sizeof path, "%s.pub", prefix);
    snprintf(text, sizeof text, "# pippin CURVE public key (Z85)\n%s\n", pub);
    pp_status s = write_file(path, text, 0644, overwrite);
    if (s != PP_OK) {
        char keypath[4096];
        snprintf(keypath, sizeof keypath, "%s.key", prefix);
        unlink(keypath);
        return s;
    }
    if (public_z85) memcpy(public_z85, pub, sizeof pub);
    return PP_OK;
}

pp_status pp_curve_read_key(const char *path, char z85[PP_CURVE_KEY_CHARS + 1]) {
    FILE *f = fopen(path, "r");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    char line[512];
    int found = 0, lineno = 0;
    pp_status s = PP_OK;
    while (!found && fgets(line, sizeof line, f)) {
        lineno++;
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strlen(p);
        while (n && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
            p[--n] = 0;
        if (n == 0 || p[0] == '#') continue;
        if (!pp_curve_key_valid(p)) {
            s = pp_error(PP_ERR_PARSE, "%s:%d: not a CURVE key (expected 40 characters of Z85 text)",
                         path, lineno);
            break;
        }
        memcpy(z85, p, PP_CURVE_KEY_CHARS + 1);
        found = 1;
    }
    if (s == PP_OK && !found) s = pp_error(PP_ERR_PARSE, "%s: no key in the file", path);
    if (s == PP_OK && fstat(fileno(f), &st) == 0 && (st.st_mode & 077)) {
        size_t n = strlen(path);
        if (n > 4 && strcmp(path + n - 4, ".key") == 0)
            pp_warn("secret key file %s is readable by other users (chmod 600 it)", path);
    }
    memset(line, 0, sizeof line);
    fclose(f);
    return s;
}
