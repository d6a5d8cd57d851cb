/* File reads with the checks every loader needs, and durable
 * (write, fsync, rename, fsync the directory) replacement of files. */
#include "file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status_internal.h"
pp_status pp_open_file(const char *path, size_t max_bytes, int *fd_out, size_t *size) {
    *fd_out = -1;
    *size = 0;
    /* O_NONBLOCK: a FIFO must not hang the open (refused below) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    pp_status s = PP_OK;
    if (fstat(fd, &st) != 0) s = pp_error(PP_ERR_IO, "%s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode)) s = pp_error(PP_ERR_IO, "%s: not a regular file", path);
    else if ((unsigned long long)st.st_size > max_bytes)
        s = pp_error(PP_ERR_UNSUPPORTED, "%s: %lld bytes (at most %zu)", path, (long long)st.st_size, max_bytes);
    if (s != PP_OK) {
        close(fd);
        return s;
    }
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return PP_OK;
}

pp_status pp_read_at(int fd, void *dst, size_t n, uint64_t off, const char *what) {
    size_t got = 0;
    while (got < n) {
        /* at most 1 GiB a call: Linux reads at most ~2 GiB at once anyway */
        size_t want = n - got < ((size_t)1 << 30) ? n - got : (size_t)1 << 30;
        ssize_t r = pread(fd, (unsigned char *)dst + got, want, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return pp_error(PP_ERR_IO, "%s: read at offset %llu: %s", what, (unsigned long long)(off + got),
                                   strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got < n)
        return pp_error(PP_ERR_IO, "%s: expected %zu bytes at offset %llu, got %zu (the file is shorter than when "
                        "it was opened: truncated or rewritten while it was read?)", what, n, (unsigned long long)off, got);
    return PP_OK;
}

pp_status pp_read_file(const char *path, size_t max_bytes, unsigned char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    int fd;
    size_t size;
    PP_TRY(pp_open_file(path, max_bytes, &fd, &size));
    pp_status s = PP_OK;
    if (!(*buf = malloc(size + 1))) s = pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    else s = pp_read_at(fd, *buf, size, 0, path);
    close(fd);
    if (s != PP_OK) {
        free(*buf);
        *buf = NULL;
        return s;
    }
    *len = size;
    return PP_OK;
}

/* A temporary file unlocked and untouched this long is a dead writer's:
 * the writer locks its file right after creating it (the minute covers
 * that moment), and the lock goes with its process however it ends. */
#define STALE_AFTER_S 60

/* Removes what writers of path that died mid-write left beside it:
 * PATH.tmp.* files nobody holds locked (flock: across processes, pid
 * namespaces and, where the file system keeps locks, hosts) and older
 * than STALE_AFTER_S. A file that cannot be checked or removed stays. */
static void sweep_stale(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *base = slash ? strrchr(path, '/') + 1 : path;
    if (slash) slash[slash == dir ? 1 : 0] = '\0';
    const char *where = slash ? dir : ".";
    char prefix[512];
    int plen = snprintf(prefix, sizeof prefix, "%s.tmp.", base);
    DIR *d = plen > 0 && (size_t)plen < sizeof prefix ? opendir(where) : NULL;
    time_t now = time(NULL);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > STALE_AFTER_S &&
            flock(fd, LOCK_EX | LOCK_NB) == 0)
            unlinkat(dirfd(d), e->d_name, 0);
        if (fd >= 0) close(fd);
    }
    if (d) closedir(d);
    free(dir);
}

pp_status pp_atomic_open(const char *path, pp_atomic_file *af) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 32;
    af->path = strdup(path);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        pp_atomic_discard(af);
        return pp_error(PP_ERR_NOMEM, "%s: out of memory", path);
    }
    /* a random name: writers on several hosts of a shared directory (where
     * pids repeat) never meet in one temporary file */
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
        static _Atomic uint64_t counter;
        r = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ counter++;
    }
    snprintf(af->tmp, n, "%s.tmp.%016llx", path, (unsigned long long)r);
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) (void)flock(fd, LOCK_EX | LOCK_NB); /* held until closed: sweep_stale leaves it alone */
    af->f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!af->f) {
        pp_status s = pp_error(PP_ERR_IO, "%s: %s", af->tmp, strerror(errno));
        if (fd >= 0) close(fd);
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
        sweep_stale(af->path);
        s = pp_fsync_parent(af->path);
    }
    pp_atomic_discard(af);
    return s;
}
