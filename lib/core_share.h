/* Internal: the pool's side of the cores lent between the ranks of one
 * host (lib/core_share.c; the public calls are in pippin/exec.h). */
#ifndef PIPPIN_LIB_CORE_SHARE_H
#define PIPPIN_LIB_CORE_SHARE_H

/* The threads a parallel call may use now, up to `threads` (the pool's
 * size): this rank's own plus what the host's waiting ranks lend. Never
 * waits. Not joined: threads. Each claim is followed by a release with
 * the count it returned. */
int pp_share_cores_claim(int threads);
void pp_share_cores_release(int threads);

/* The shared-memory name the ranks of key meet under (for tests). */
void pp_share_cores_segment_name(const char *key, char *out, size_t cap);

#endif
