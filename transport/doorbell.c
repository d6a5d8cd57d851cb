/* Doorbells: named FIFOs in /dev/shm. See doorbell.h. */
#include "doorbell.h"
#include "shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "status_internal.h"
#define PREFIX "/dev/shm/pippin-bell-"

struct pp_doorbell {
    char path[96];
    int fd;
};

pp_status pp_doorbell_create(pp_doorbell **out) {
    static atomic_uint counter;
    *out = NULL;
    pp_doorbell *b = calloc(1, sizeof *b);
    if (!b) return pp_error(PP_ERR_NOMEM, "out of memory");
    for (int tries = 0; tries < 100; tries++) {
        snprintf(b->path, sizeof b->path, PREFIX "%llx-%ld-%u", pp_shm_pid_ns(), (long)getpid(),
                 atomic_fetch_add(&counter, 1) + 1);
        if (mkfifo(b->path, 0600) == 0) break;
        if (errno != EEXIST) {
            pp_status s = pp_error(PP_ERR_IO, "doorbell %s: %s", b->path, strerror(errno));
            free(b);
            return s;
        }
    }
    /* read-write: opening never blocks, and the FIFO never reports EOF */
    b->fd = open(b->path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (b->fd < 0) {
        pp_status s = pp_error(PP_ERR_IO, "doorbell %s: %s", b->path, strerror(errno));
        unlink(b->path);
        free(b);
        return s;
    }
    *out = b;
    return PP_OK;
}

const char *pp_doorbell_path(const pp_doorbell *b) { return b->path; }

int pp_doorbell_fd(const pp_doorbell *b) { return b->fd; }

void pp_doorbell_clear(pp_doorbell *b) {
    char buf[256];
    while (read(b->fd, buf, sizeof buf) > 0) {
    }
}

void pp_doorbell_close(pp_doorbell *b) {
    if (!b) return;
    close(b->fd);
    unlink(b->path);
    free(b);
}

int pp_doorbell_path_ok(const char *path) {
    if (strncmp(path, PREFIX, sizeof PREFIX - 1) != 0 || strlen(path) >= 96) return 0;
    for (const char *p = path + sizeof PREFIX - 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == '-')) return 0;
    return path[sizeof PREFIX - 1] != 0;
}

int pp_doorbell_open_peer(const char *path) {
    if (!pp_doorbell_path_ok(path)) return -1;
    /* Read-write although we only write: with ourselves as a reader the
     * FIFO never loses its last one when the peer dies, so a ring can
     * never raise SIGPIPE (which would end this process); once full it
     * just says EAGAIN. No signal juggling on the small-message path. */
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_uid != geteuid()) {
        close(fd);
        return -1;
    }
    return fd;
}

void pp_doorbell_ring(int fd) {
    if (fd < 0) return;
    ssize_t w = write(fd, "", 1);
    (void)w; /* EAGAIN: full, so it is rung already */
}
