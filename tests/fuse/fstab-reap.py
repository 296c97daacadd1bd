# SPDX-License-Identifier: MIT
# castfs as mount(8) and mount.fuse3 run it in tests/fuse/fstab.sh, which
# prepends the interpreter line and fills in @CASTFS@ and @STATUS@. It
# returns the real castfs's status once castfs has mounted and detached,
# as castfs would, but a monitor process left behind (a child subreaper)
# inherits the detached daemon and writes every exit status it reaps to
# STATUS/<pid>.done ("exit CODE PID ARGS"): daemons started by mount(8)
# are otherwise nobody's children, and a sanitizer report at their exit
# would go unseen.
import ctypes
import os
import sys

CASTFS = "@CASTFS@"
STATUS = "@STATUS@"
PR_SET_CHILD_SUBREAPER = 36


def code(st):
    return os.waitstatus_to_exitcode(st)


def monitor(w):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0):
        os.write(w, b"99")
        os._exit(99)
    child = os.fork()
    if child == 0:
        os.close(w)
        os.execv(CASTFS, [CASTFS] + sys.argv[1:])
    _, st = os.waitpid(child, 0)  # castfs's parent: mounted and detached
    os.write(w, str(code(st)).encode())
    os.close(w)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    lines = []
    while True:  # the detached daemon (and any it left behind)
        try:
            pid, st = os.wait()
        except ChildProcessError:
            break
        lines.append("exit %d %d %s\n" % (code(st), pid, " ".join(sys.argv[1:])))
    tmp = os.path.join(STATUS, "%d.tmp" % os.getpid())
    with open(tmp, "w") as f:
        f.write("".join(lines) or "exit 0 - no detached daemon\n")
    os.rename(tmp, tmp[:-4] + ".done")
    os._exit(0)


def main():
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        monitor(w)
    os.close(w)
    got = b""
    while True:
        b = os.read(r, 16)
        if not b:
            break
        got += b
    sys.exit(int(got or b"1"))


main()
