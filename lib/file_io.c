/* Whole-file reads with the checks every loader needs, and durable
 * (write, fsync, rename, fsync the directory) replacement of files. */
#include "file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

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

pp_status pp_map_file(const char *path, size_t max_bytes, pp_mapped_file *mf) {
    static const unsigned char empty[1];
    memset(mf, 0, sizeof *mf);
    /* O_NONBLOCK: a FIFO must not hang the open (refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    pp_status s = PP_OK;
    if (fstat(fd, &st) != 0) s = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = pp_error(PP_ERR_IO, "%s: not a regular file", path);
    else if ((unsigned long long)st.st_size > max_bytes)
        s = pp_error(PP_ERR_UNSUPPORTED, "%s: %lld bytes (at most %zu)", path, (long long)st.st_size, max_bytes);
    if (s == PP_OK && st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) s = pp_error(PP_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        else {
            (void)madvise(p, (size_t)st.st_size, MADV_SEQUENTIAL); /* read ahead */
            mf->bytes = p;
            mf->len = (size_t)st.st_size;
            mf->mapped = 1;
        }
    }
    close(fd); /* the mapping keeps the file */
    if (s == PP_OK && !mf->mapped) mf->bytes = empty;
    return s;
}

void pp_unmap_file(pp_mapped_file *mf) {
    if (mf->mapped) munmap((void *)(uintptr_t)mf->bytes, mf->len);
    memset(mf, 0, sizeof *mf);
}

pp_status pp_atomic_open(const char *path, pp_atomic_file *af) {
    static _Atomic unsigned counter; /* threads of one process writing beside each other */
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 64;
    af->path = strdup(path);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        pp_atomic_discard(af);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(af->tmp, n, "%s.tmp.%ld.%u", path, (long)getpid(), counter++);
    af->f = fopen(af->tmp, "wb");
    if (!af->f) {
        pp_status s = pp_error(PP_ERR_IO, "%s: %s", af->tmp, strerror(errno));
        pp_atomic_discard(af);
        return s;
    }
    return PP_OK;
}

void pp_atomic_discard(pp_atomic_file *af) {
    if (af->f) fclose(af->f);
    if (af->tmp) unlink(af->tmp);
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
}

pp_status pp_fsync_dir(const char *dir) {
    int fd = open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (fd < 0) return pp_error(PP_ERR_IO, "%s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* some file systems cannot sync a directory; their renames are as durable as they get */
    if (rc != 0 && err != EINVAL && err != ENOTSUP) return pp_error(PP_ERR_IO, "%s: fsync: %s", dir, strerror(err));
    return PP_OK;
}

pp_status pp_fsync_parent(const char *path) {
    char *dir = strdup(path);
    if (!dir) return pp_error(PP_ERR_NOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    pp_status s;
    if (!slash) s = pp_fsync_dir(".");
    else {
        slash[slash == dir ? 1 : 0] = '\0';
        s = pp_fsync_dir(dir);
    }
    free(dir);
    return s;
}

pp_status pp_atomic_commit(pp_atomic_file *af) {
    pp_status s = PP_OK;
    if (fflush(af->f) != 0 || ferror(af->f)) s = pp_error(PP_ERR_IO, "%s: write failed: %s", af->path, strerror(errno));
    else if (fsync(fileno(af->f)) != 0) s = pp_error(PP_ERR_IO, "%s: fsync: %s", af->path, strerror(errno));
    if (fclose(af->f) != 0 && s == PP_OK) s = pp_error(PP_ERR_IO, "%s: write failed: %s", af->path, strerror(errno));
    af->f = NULL;
    if (s == PP_OK && rename(af->tmp, af->path) != 0) s = pp_error(PP_ERR_IO, "%s: %s", af->path, strerror(errno));
    if (s == PP_OK) {
        free(af->tmp); /* renamed: nothing to remove */
        af->tmp = NULL;
        s = pp_fsync_parent(af->path);
    }
    pp_atomic_discard(af);
    return s;
}
