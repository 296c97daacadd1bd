# SPDX-License-Identifier: MIT
"""How a supervised mount's end reads (docs/RELIABILITY.md, "Restarts"):
a daemon that served and ended before the supervisor read that it was
ready is no failed start. Apart from test_stop_signal, whose gdb case
skips under the sanitizers, so that this one counts there.
"""
import fcntl
import os
import signal
import struct
import subprocess
import tempfile
import termios
import time
import unittest

import castfs_testlib as tl
import rel_common as rc


# One checkpoint, made once for every mount of this file.
SOURCE, setUpModule, tearDownModule = rc.one_ckpt_source()


class EndedBeforeReadyRead(unittest.TestCase):
    src = property(lambda self: SOURCE.src)

    def test_a_daemon_that_served_then_ended_is_no_failed_start(self):
        """The supervisor took the SIGCHLD of its first daemon before the
        ready byte that daemon wrote first (a quick unmount while the
        supervisor was not scheduled: a CI run of test_names), so a
        daemon that served was taken for one that never started: exit 1,
        nothing logged. The supervisor is stopped here before it reads
        the byte, the mount used and unmounted, the daemon ended; then it
        goes on and must exit 0."""
        for _ in range(30):
            with tl.tempdir(prefix="castfs-mnt-") as mnt:
                if self.one_try(mnt):
                    return
        self.skipTest("the supervisor always read the ready byte first")

    def one_try(self, mnt):
        """Whether the supervisor was caught with the byte unread."""
        log = tempfile.TemporaryFile(mode="w+")
        sup = subprocess.Popen([tl.castfs_binary(), "-f", self.src, mnt],
                               stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT)
        d = first_child(sup.pid)  # polled without a pause: the window
        os.kill(sup.pid, signal.SIGSTOP)  # is its exec and INIT
        ready = ready_pipe(sup.pid)
        try:
            if ready is not None:
                rc.poll(lambda: pending(ready) == 1 or state(d) == "Z",
                        30, "the ready byte")
            if ready is None or pending(ready) != 1:
                return False  # read already, or no daemon: again
            with open(os.path.join(mnt, "a.fp8.safetensors"), "rb") as f:
                self.assertGreater(len(f.read()), 0)
            subprocess.run(["fusermount3", "-u", mnt], check=True)
            rc.poll(lambda: state(d) == "Z", 30, "the daemon ended")
            self.assertEqual(pending(ready), 1)  # still unread
        finally:
            if ready is not None:
                os.close(ready)
            os.kill(sup.pid, signal.SIGCONT)
            if os.path.ismount(mnt):
                subprocess.run(["fusermount3", "-u", mnt], check=False)
            status = sup.wait(60)
            log.seek(0)
            out = log.read()
        self.assertEqual(status, 0, out)
        return True


def first_child(pid, timeout=30):
    """Process @pid's first child, as soon as it is forked."""
    path = "/proc/%d/task/%d/children" % (pid, pid)
    end = time.time() + timeout
    while time.time() < end:
        with open(path) as f:
            kids = f.read().split()
        if kids:
            return int(kids[0])
    raise AssertionError("no daemon forked")


def ready_pipe(pid):
    """A read end of process @pid's ready pipe (its one pipe past the
    standard streams), or None."""
    for fd in sorted(os.listdir("/proc/%d/fd" % pid), key=int):
        path = "/proc/%d/fd/%s" % (pid, fd)
        try:
            if int(fd) > 2 and os.readlink(path).startswith("pipe:"):
                return os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            pass
    return None


def pending(fd):
    """Bytes waiting in pipe @fd."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD,
                                          b"\0" * 4))[0]


def state(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


if __name__ == "__main__":
    tl.main()
