#!/usr/bin/python3
"""userns.py OUTER_ID COMMAND...: runs COMMAND as root of a new user namespace
whose ids 0-65535 are OUTER_ID.. outside (its files and shared-memory objects
belong to uid OUTER_ID). Needs root. The namespace's process is a child: this
one writes its id maps (a process cannot map ids other than its own into the
namespace it is in), passes SIGTERM/SIGINT on and exits with its status.
No newuidmap needed (unshare --map-users wants it)."""
import ctypes
import os
import signal
import sys

CLONE_NEWUSER = 0x10000000


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    outer = int(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    go_r, go_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(ready_r)
        if libc.unshare(CLONE_NEWUSER) != 0:
            os.write(2, b"userns.py: unshare(CLONE_NEWUSER): %s\n" % os.strerror(ctypes.get_errno()).encode())
            os._exit(126)
        os.write(ready_w, b"1")
        if os.read(go_r, 1) != b"1":
            os._exit(126)
        # root inside: the maps exist now, and no exec came between unshare
        # and these calls, so the namespace's capabilities are still ours
        os.setgroups([])
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        try:
            os.execvp(sys.argv[2], sys.argv[2:])
        except OSError as e:
            os.write(2, b"userns.py: %s: %s\n" % (sys.argv[2].encode(), str(e).encode()))
            os._exit(127)
    os.close(go_r)
    os.close(ready_w)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: os.kill(pid, s))
    ok = os.read(ready_r, 1) == b"1"
    if ok:
        try:
            for name in ("gid_map", "uid_map"):
                with open("/proc/%d/%s" % (pid, name), "w") as f:
                    f.write("0 %d 65536\n" % outer)
        except OSError as e:
            sys.stderr.write("userns.py: cannot map ids: %s\n" % e)
            ok = False
    os.write(go_w, b"1" if ok else b"0")
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
