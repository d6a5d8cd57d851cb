/* Whole-file reads with the checks every loader needs. */
#include "file_io.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "status_internal.h"
pp_status pp_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    pp_status s = PP_OK;
    /* fopen succeeds on a directory; ftell would then report nonsense. */
    if (fstat(fileno(f), &st) != 0) s = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = pp_error(PP_ERR_IO, "%s: not a regular file", path);
    else if ((unsigned long long)st.st_size > max_bytes)
        s = pp_error(PP_ERR_UNSUPPORTED, "%s: %lld bytes (at most %zu)", path, (long long)st.st_size, max_bytes);
    if (s == PP_OK && !(*buf = malloc((size_t)st.st_size + 1))) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    if (s == PP_OK && fread(*buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        s = pp_error(PP_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (s != PP_OK) {
        free(*buf);
        *buf = NULL;
        return s;
    }
    *len = (size_t)st.st_size;
    return PP_OK;
}
