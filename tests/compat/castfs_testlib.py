# SPDX-License-Identifier: MIT
"""Shared helpers for castfs tests that mount a real FUSE filesystem.

Every test starts its own daemon (`castfs -f SRC MNT`), waits until the
kernel lists the mount, and unmounts it with fusermount3 at the end. A test
program exits 77 (automake's SKIP, never a pass) when FUSE is unusable.
"""
import contextlib
import fcntl
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SKIP = 77


def castfs_binary():
    exe = os.environ.get("CASTFS")
    if exe:
        return exe
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "..", "..", "fs", "castfs")


def fuse_usable():
    return os.path.exists("/dev/fuse") and os.access("/dev/fuse", os.R_OK | os.W_OK) \
        and shutil.which("fusermount3") is not None


def _mounted(mnt):
    mnt = os.path.realpath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            point = parts[4].replace("\\040", " ")
            if point == mnt and " - fuse.castfs " in line:
                return True
    return False


def _alive(pid):
    """Whether process @pid exists and is no zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


class Mount:
    """A running castfs daemon in the foreground, mounted at self.path."""

    def __init__(self, source, options=(), extra_args=(), env=None, timeout=30,
                 mountpoint=None, prefix=()):
        self.source = source
        # A caller's mount point is left in place at unmount.
        self.tmp = None if mountpoint else tempfile.mkdtemp(prefix="castfs-mnt-")
        self.path = mountpoint or os.path.join(self.tmp, "mnt")
        if not mountpoint:
            os.mkdir(self.path)
        # prefix: a command that runs castfs (e.g. setpriv dropping a
        # capability); self.proc is then that command's process.
        args = list(prefix) + [castfs_binary(), "-f"]
        # CASTFS_TEST_OPTIONS: -o options every mount of a run adds
        # (say nosupervise, to run a suite against one process).
        extra = os.environ.get("CASTFS_TEST_OPTIONS", "").split()
        for o in list(options) + extra:
            args += ["-o", o]
        self.supervised = "nosupervise" not in list(options) + extra
        args += list(extra_args) + [source, self.path]
        self.log = tempfile.TemporaryFile(mode="w+")
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=full_env)
        deadline = time.time() + timeout
        while not _mounted(self.path):
            if self.proc.poll() is not None:
                raise RuntimeError("castfs exited with %d: %s" %
                                   (self.proc.returncode, self.output()))
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("castfs did not mount: " + self.output())
            time.sleep(0.02)

    def daemon(self, timeout=30):
        """The pid of the process serving the mount: the one started under
        -o nosupervise, else the supervisor's newest live child (a killed
        one stays a child, a zombie, until reaped; a reload's old one
        until it leaves). The supervisor mounts before it starts its
        daemon, so the mount is there before the daemon is: this waits
        for it."""
        pid = self.proc.pid
        if not self.supervised:
            return pid
        deadline = time.time() + timeout
        while True:
            kids = []
            try:
                for task in sorted(os.listdir("/proc/%d/task" % pid)):
                    with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                        kids += f.read().split()
            except FileNotFoundError:
                pass
            kids = [k for k in kids if _alive(int(k))]
            if kids:
                return int(kids[-1])  # the list is in order of birth
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("no daemon under the supervisor: " +
                                   self.output())
            time.sleep(0.01)

    def stats(self):
        """The daemon's /.castfs/stats, parsed."""
        with open(self.join(".castfs", "stats")) as f:
            return json.load(f)

    def output(self):
        self.log.seek(0)
        return self.log.read()

    def join(self, *parts):
        return os.path.join(self.path, *parts)

    def unmount(self):
        if self.proc is None:
            return 0
        if _mounted(self.path):
            subprocess.run(["fusermount3", "-u", self.path], check=False)
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if rc != 0:
            # The daemon's own words (a sanitizer report, an assertion)
            # belong in the test log: CI keeps nothing else.
            sys.stderr.write("castfs exited with %d; its output:\n%s\n"
                             % (rc, self.output()[-20000:]))
        return rc

    def close(self):
        """unmount(), and an AssertionError unless the daemon exited 0 (a
        sanitizer report or a crash at exit fails the test)."""
        rc = self.unmount()
        if rc != 0:
            raise AssertionError("castfs exited with %d: %s" %
                                 (rc, self.output()[-20000:]))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.unmount()
        if exc[0] is None and rc != 0:
            raise AssertionError("castfs exited with %d: %s" % (rc, self.output()))


# Tests run in parallel (make -j check), and dropping the kernel's caches
# is global: a test that relies on a cached entry or page meanwhile (an
# entry kept until its timeout, one conversion shared through the page
# cache) holds this lock shared, and every drop takes it exclusive.
CACHE_LOCK = os.path.join(tempfile.gettempdir(), "castfs-tests-caches.lock")


def fuse_connections():
    """The fusectl directory (/sys/fs/fuse/connections), mounted first
    when it is not (best effort: a caller reading a file there then
    fails with the reason). Not by its being empty: it is, mounted,
    while no FUSE file system is."""
    ctl = "/sys/fs/fuse/connections"
    if not os.path.ismount(ctl):
        subprocess.run(["mount", "-t", "fusectl", "none", ctl])
    return ctl


def drop_caches(what):
    """Write @what (1 pages, 2 dentries and inodes, 3 both) to
    /proc/sys/vm/drop_caches, outside every caches_kept() of the run.
    Never call it inside caches_kept(): the locks would wait on each other."""
    with open(CACHE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("%d\n" % what)


@contextlib.contextmanager
def caches_kept():
    """No test of this run drops the kernel's caches while in it."""
    with open(CACHE_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield


def rss_mb(pid, key="VmRSS"):
    """The resident memory of process @pid in MB (VmRSS; VmHWM: its
    peak so far)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no " + key)


def sanitizer(pid):
    """The sanitizer runtime the daemon @pid runs under, or None: ASan and
    TSan allocators keep freed memory (quarantine, shadow), so RSS bounds
    say nothing about castfs there."""
    with open("/proc/%d/maps" % pid) as f:
        maps = f.read()
    return next((lib for lib in ("libasan", "libtsan") if lib in maps), None)


@contextlib.contextmanager
def tempdir(prefix="castfs-src-"):
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class ModuleSource:
    """A test module's source folder, made once for all its mounts:
    setUpModule calls start(populate), tearDownModule stop(). start skips
    the module where FUSE is unusable, else makes the folder (.src) and
    has populate(path) write the checkpoints into it; stop removes it."""

    def __init__(self):
        self.src = None
        self._ctx = None

    def start(self, populate):
        if not fuse_usable():
            raise unittest.SkipTest("FUSE unusable")
        self._ctx = tempdir()
        self.src = self._ctx.__enter__()
        populate(self.src)

    def stop(self):
        if self._ctx:
            self._ctx.__exit__(None, None, None)
        self._ctx = self.src = None


def read_ranges(path, size, rng, count=200, max_len=1 << 20):
    """Yield (off, data) for random ranges of the file, read with pread."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(count):
            off = rng.randrange(0, max(size, 1))
            n = rng.randrange(1, max_len)
            yield off, os.pread(fd, n, off)
    finally:
        os.close(fd)


def check_ranges(test, path, expected, rng=None, count=200):
    """Random preads of @path must equal slices of @expected (bytes)."""
    rng = rng or random.Random(1234)
    for off, data in read_ranges(path, len(expected), rng, count,
                                 max_len=min(len(expected) + 2, 1 << 20)):
        test.assertEqual(data, expected[off:off + len(data)], "range at %d" % off)
        test.assertEqual(len(data), max(0, min(len(expected) - off, len(data))))


def summary(result):
    """(Check-style summary line, exit status) of a unittest result.

    A case counts once however many of its subtests fail, so the percentage
    is never negative (CI's summary reader only takes lines that start with
    digits). Exit status: 1 when anything failed or nothing ran; 77
    (automake's SKIP) when a case was skipped (unittest.SkipTest), so that a
    skip is never reported as a pass; else 0.
    """
    n = result.testsRun
    fails, errs = len(result.failures), len(result.errors)
    skipped = len(result.skipped)

    def case(t):
        return getattr(t, "test_case", t).id()

    bad = {case(t) for t, _ in result.failures + result.errors}
    bad |= {case(t) for t, _ in result.skipped}
    ok = max(0, n - len(bad))
    pct = 100 * ok // n if n else 0
    line = "%d%%: Checks: %d, Failures: %d, Errors: %d, Skipped: %d" % (
        pct, n, fails, errs, skipped)
    if not n or not result.wasSuccessful():
        return line, 1
    return line, SKIP if skipped else 0


def main():
    """Run the unittest cases of __main__ and print a Check-style summary."""
    if not fuse_usable():
        print("SKIP: /dev/fuse or fusermount3 unusable")
        sys.exit(SKIP)
    loader = unittest.TestLoader()
    # CASTFS_TEST_K="pat1 pat2": only the cases matching (unittest -k), for
    # scripts/mutate, which reruns the cases that kill a planted bug.
    pats = os.environ.get("CASTFS_TEST_K", "").split()
    if pats:
        loader.testNamePatterns = ["*%s*" % p for p in pats]
    suite = loader.loadTestsFromModule(sys.modules["__main__"])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    line, rc = summary(result)
    print(line)
    if rc == SKIP:
        print("SKIP: %d case(s) skipped: %s" % (
            len(result.skipped),
            "; ".join("%s (%s)" % (t.id(), why) for t, why in result.skipped)))
    sys.exit(rc)
