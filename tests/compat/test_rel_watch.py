# SPDX-License-Identifier: MIT
"""The watcher's and the leases' documented fallbacks (docs/RELIABILITY.md
"How changes are detected"), each in a real mount:

- an inotify queue overflow rescans every directory: the daemon is stopped
  (SIGSTOP) while more events than its queue holds arrive and then the
  source is replaced by rename, a new one made, a file and a directory
  deleted (those events are lost); after SIGCONT the replaced and the new
  file must show and the deleted ones must be gone, although their
  entries are cached for a day. The queue is made
  small by lowering fs.inotify.max_queued_events (root) only while the
  daemon creates its inotify instance, and restored at once (the limit is
  read when an instance is created).
- the rescan after an overflow costs what changed: in a listed directory
  of held checkpoints only the changed names are invalidated (counted in
  /.castfs/stats), and each kind of change shows, byte for byte (class
  Rescan); held names of files deleted meanwhile all go, past the
  128-name batches of the seen-name test (class RescanHeld); a packed
  source is compared like a plain one (class RescanPacked).
- the watch cap: a source of more than 65536 directories is watched up
  to the cap (logged); a change beyond it shows once the entry timeout
  expires, a change within it at once.
- without leases (the daemon without CAP_LEASE, sources it does not own)
  a writer's open breaks nothing (there is no lease to break) and a moved
  size fails the next read of an open file with EIO (the fstat fallback).
"""
import errno
import json
import os
import signal
import subprocess
import tempfile
import time
import unittest

import torch
from safetensors.torch import save, save_file

import castfs_testlib as tl
import rel_common as rc

QUEUE = "/proc/sys/fs/inotify/max_queued_events"
SETTLE = 10.0
NOBODY = 65534


def family(pid):
    """@pid and its children (the daemon under the supervisor)."""
    pids = [pid]
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def inotify_holder(pid):
    """The process of @pid's family holding an inotify fd, or None."""
    for p in family(pid):
        try:
            fds = os.listdir("/proc/%d/fd" % p)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (p, fd)) == "anon_inode:inotify":
                    return p
            except OSError:
                continue
    return None


def small_queue_mount(src):
    """A mount of @src whose watcher's inotify queue holds 16 events
    (the limit is read when the instance is made, then put back); the
    mount and the pid of the process holding the watcher."""
    with open(QUEUE) as f:
        saved = f.read().strip()
    try:
        with open(QUEUE, "w") as f:
            f.write("16")
        mount = tl.Mount(src)
        rc.poll(lambda: inotify_holder(mount.proc.pid) is not None,
                30, "the watcher's inotify instance")
        return mount, inotify_holder(mount.proc.pid)
    finally:
        with open(QUEUE, "w") as f:
            f.write(saved)


def exists(path):
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False


class Overflow(unittest.TestCase):
    def test_queue_overflow_invalidates_every_entry(self):
        if os.geteuid() != 0 or not os.access(QUEUE, os.W_OK):
            raise unittest.SkipTest("needs root to lower %s" % QUEUE)
        with tl.tempdir() as src:
            path = os.path.join(src, "c.safetensors")
            rc.write_ckpt(path, seed=1)
            gone = os.path.join(src, "d.safetensors")
            rc.write_ckpt(gone, seed=4)
            os.mkdir(os.path.join(src, "sub"))
            rc.write_ckpt(os.path.join(src, "sub", "e.safetensors"), seed=5)
            mount, daemon = small_queue_mount(src)
            try:
                view = mount.join(rc.view_name("c", "fp16"))
                new_view = mount.join(rc.view_name("n", "fp16"))
                # Cached for a day (entry and attribute timeouts), the
                # missing name too where negative entries are cached.
                before = os.stat(view).st_size
                self.assertFalse(exists(new_view))
                deleted = [mount.join("d.safetensors"),
                           mount.join(rc.view_name("d", "fp16")),
                           mount.join("sub"),
                           mount.join("sub", rc.view_name("e", "fp16"))]
                for p in deleted:
                    self.assertTrue(exists(p), p)
                os.kill(daemon, signal.SIGSTOP)
                try:
                    for i in range(64):  # several times the queue
                        with open(os.path.join(src, "junk%02d" % i), "w") as f:
                            f.write("x")
                    # Their events find the queue full.
                    t = rc.write_ckpt(path + ".tmp", seed=2, scale=2)
                    os.rename(path + ".tmp", path)
                    rc.write_ckpt(os.path.join(src, "n.safetensors"), seed=3)
                    os.unlink(gone)
                    os.unlink(os.path.join(src, "sub", "e.safetensors"))
                    os.rmdir(os.path.join(src, "sub"))
                finally:
                    os.kill(daemon, signal.SIGCONT)
                want = len(rc.view_bytes(t, "fp16"))
                self.assertNotEqual(want, before)
                rc.poll(lambda: os.stat(view).st_size == want and
                        exists(new_view), SETTLE,
                        "the replaced and the new file to show after the "
                        "overflow")
                rc.poll(lambda: not any(exists(p) for p in deleted), SETTLE,
                        "the deleted file and directory to go after the "
                        "overflow")
                self.assertIn("inotify queue overflowed", mount.output())
                self.assertIn("junk63", os.listdir(mount.path))
            finally:
                mount.close()


def tiny(seed, rows=4):
    """A small checkpoint's tensors (random normal float32)."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(rows, 8, generator=g)}


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Rescan(unittest.TestCase):
    """After lost events the rescan compares each directory with what its
    listing found: of N held checkpoints where k changed, only those k
    are invalidated (the whole-directory rescan sent every held name),
    and each kind of change shows: a file replaced by rename (new size),
    one rewritten in place with its size and mtime put back (only its
    ctime moved), one renamed over another with the same size and mtime
    (only inode and ctime differ), a new file, a deleted one. Oracle: the
    safetensors writer on torch's casts (rc.view_bytes)."""
    N = 120

    def test_rescan_reports_only_what_changed(self):
        if os.geteuid() != 0 or not os.access(QUEUE, os.W_OK):
            raise unittest.SkipTest("needs root to lower %s" % QUEUE)
        with tl.tempdir() as src:
            def f(i):
                return os.path.join(src, "f%03d.safetensors" % i)
            orig = {}
            for i in range(self.N):
                orig[i] = tiny(i)
                save_file(orig[i], f(i))
            for j in ("junk0", "junk1"):
                with open(os.path.join(src, j), "w") as fp:
                    fp.write("x")
            mount, daemon = small_queue_mount(src)
            try:
                self.check(mount, daemon, src, f, orig)
            finally:
                mount.close()

    def check(self, mount, daemon, src, f, orig):
        def view(i):
            return mount.join("f%03d.fp16.safetensors" % i)
        names = os.listdir(mount.path)  # the snapshot the rescan uses
        self.assertIn("f000.fp16.safetensors", names)
        # The kernel holds every file and its view, with their bytes.
        for i in range(self.N):
            os.stat(mount.join("f%03d.safetensors" % i))
            self.assertEqual(read(view(i)), rc.view_bytes(orig[i], "fp16"))
        new_view = mount.join("n.fp16.safetensors")
        self.assertFalse(exists(new_view))
        # The watcher reads its idle queue at least once a second; a
        # snapshot counts once such a read follows it (with room for a
        # loaded machine: a miss would rescan the directory whole).
        time.sleep(3.0)
        before = mount.stats()
        os.kill(daemon, signal.SIGSTOP)
        try:
            for i in range(64):  # several times the queue, two names
                with open(os.path.join(src, "junk%d" % (i % 2)), "w") as fp:
                    fp.write("y" * i)
            replaced = tiny(1000, rows=9)
            save_file(replaced, f(0) + ".tmp")
            os.rename(f(0) + ".tmp", f(0))
            # In place, same size, mtime put back: only the ctime moves.
            inplace = tiny(1001)
            st = os.stat(f(1))
            data = save(inplace)
            self.assertEqual(len(data), st.st_size)
            with open(f(1), "r+b") as fp:
                fp.write(data)
            os.utime(f(1), ns=(st.st_atime_ns, st.st_mtime_ns))
            # f004 over f003: same size, f003's mtime: only the inode
            # (and the ctime) tell them apart.
            st = os.stat(f(3))
            os.utime(f(4), ns=(st.st_atime_ns, st.st_mtime_ns))
            os.rename(f(4), f(3))
            added = tiny(1002)
            save_file(added, os.path.join(src, "n.safetensors"))
            os.unlink(f(2))
        finally:
            os.kill(daemon, signal.SIGCONT)
        rc.poll(lambda: exists(new_view) and
                os.stat(view(0)).st_size ==
                len(rc.view_bytes(replaced, "fp16")), SETTLE,
                "the new and the replaced file to show after the overflow")
        rc.poll(lambda: not exists(view(2)) and not exists(view(4)), SETTLE,
                "the deleted and the renamed-away file to go")
        self.assertIn("inotify queue overflowed", mount.output())
        self.assertEqual(read(view(0)), rc.view_bytes(replaced, "fp16"))
        self.assertEqual(read(view(1)), rc.view_bytes(inplace, "fp16"))
        self.assertEqual(read(view(3)), rc.view_bytes(orig[4], "fp16"))
        self.assertEqual(read(new_view), rc.view_bytes(added, "fp16"))
        self.assertEqual(read(view(5)), rc.view_bytes(orig[5], "fp16"))
        after = mount.stats()
        sent = after["entry_invalidations"] - before["entry_invalidations"]
        # Changed: f000, f001, f003 (+ new n, junk0, junk1); gone: f002,
        # f004. The whole-directory rescan sent at least 2 per held
        # checkpoint (the file and its view): 240 here.
        self.assertLess(sent, 60, (before, after))
        self.assertGreaterEqual(
            after["rescan_entries_compared"] -
            before["rescan_entries_compared"], self.N)
        self.assertLessEqual(
            after["rescan_entries_reported"] -
            before["rescan_entries_reported"], 10, (before, after))


def overflow(daemon, src, change):
    """Stop @daemon, make its inotify queue overflow with writes to two
    junk files of @src, call @change (whose events are lost too), and let
    the daemon go on."""
    os.kill(daemon, signal.SIGSTOP)
    try:
        for i in range(64):  # several times the queue, two names
            with open(os.path.join(src, "junk%d" % (i % 2)), "w") as fp:
                fp.write("y" * i)
        change()
    finally:
        os.kill(daemon, signal.SIGCONT)


def needs_queue_root():
    if os.geteuid() != 0 or not os.access(QUEUE, os.W_OK):
        raise unittest.SkipTest("needs root to lower %s" % QUEUE)


def gone_count(nviews, batch=128):
    """More than @batch deleted checkpoints, so many that the last batch
    of candidate names begins at or before the last one's own name: the
    rescan tests a deleted file's 2 + 3 x views candidates (its name, its
    tree, per view a directory view, the view and its tree; ns.c,
    invalidate_names) against the seen-name set @batch at a time."""
    k = 2 + 3 * nviews
    for g in range(batch + 1, 2 * batch + 2):
        if (g * k - 1) % batch + 1 >= k:
            return g
    raise AssertionError("no count fits %d candidates a file" % k)


class RescanHeld(unittest.TestCase):
    """Held names of files deleted while events were lost go, every one:
    over 128 deleted checkpoints whose file and fp16 view the kernel
    holds, the last one's names in the rescan's last batch of candidate
    names (gone_count; commit dbb5805 sent that batch). Oracle: stat's
    ENOENT, the listing, and torch's casts for the survivors."""
    N = 288  # gone_count's most, and survivors

    def test_every_deleted_held_name_goes(self):
        needs_queue_root()
        with tl.tempdir() as src:
            orig = {}
            for i in range(self.N):
                orig[i] = tiny(i)
                save_file(orig[i], os.path.join(src, self.stem(i) +
                                                ".safetensors"))
            mount, daemon = small_queue_mount(src)
            try:
                with open(mount.join(".castfs", "config")) as f:
                    self.gone = gone_count(len(json.load(f)["views"]))
                self.assertLess(self.gone, self.N)
                with tl.caches_kept():  # the held dentries must stay
                    self.check(mount, daemon, src, orig)
            finally:
                mount.close()

    def stem(self, i):
        return "f%03d" % i  # the deleted ones first in the rescan

    def names(self, i):
        return [self.stem(i) + ".safetensors",
                self.stem(i) + ".fp16.safetensors"]

    def check(self, mount, daemon, src, orig):
        listed = os.listdir(mount.path)  # the snapshot the rescan uses
        for i in orig:
            for n in self.names(i):
                self.assertIn(n, listed)
                os.stat(mount.join(n))  # held by the kernel from now on
        time.sleep(3.0)  # a snapshot the rescan trusts (class Rescan)
        gone = range(self.gone)
        overflow(daemon, src, lambda: [
            os.unlink(os.path.join(src, self.stem(i) + ".safetensors"))
            for i in gone])
        held = [n for i in gone for n in self.names(i)]
        rc.poll(lambda: not any(exists(mount.join(n)) for n in held),
                SETTLE, "every deleted held name to go after the overflow")
        self.assertIn("inotify queue overflowed", mount.output())
        for n in held:
            with self.assertRaises(FileNotFoundError, msg=n):
                os.stat(mount.join(n))
        listed = set(os.listdir(mount.path))
        self.assertFalse(listed & set(held))
        for i in range(self.gone, self.N):
            self.assertEqual(read(mount.join(self.names(i)[1])),
                             rc.view_bytes(orig[i], "fp16"))


class RescanPacked(unittest.TestCase):
    """A packed source (X.safetensors.zst, shown as X.safetensors) is
    compared by the rescan like a plain one: of N held packs one replaced
    while events were lost, only that one is invalidated (before, every
    held pack was: its shown name is in no directory), and it shows its
    new bytes. Oracle: torch's casts through the safetensors writer."""
    N = 60

    def test_rescan_compares_packs(self):
        needs_queue_root()
        with tl.tempdir() as src, tl.tempdir() as work:
            orig = {}
            for i in range(self.N):
                orig[i] = tiny(i)
                save_file(orig[i], os.path.join(src, "p%03d.safetensors" % i))
            self.pack(src + "/")
            replaced = tiny(1000, rows=9)
            save_file(replaced, os.path.join(work, "r.safetensors"))
            self.pack(os.path.join(work, "r.safetensors"))
            mount, daemon = small_queue_mount(src)
            try:
                self.check(mount, daemon, src, work, orig, replaced)
            finally:
                mount.close()

    def pack(self, what):
        r = subprocess.run([tl.castfs_binary(), "pack", "--no-progress",
                            "--remove", what], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def check(self, mount, daemon, src, work, orig, replaced):
        def view(i):
            return mount.join("p%03d.fp16.safetensors" % i)
        listed = os.listdir(mount.path)
        self.assertIn("p000.safetensors", listed)  # the pack, as shown
        for i in range(self.N):
            os.stat(mount.join("p%03d.safetensors" % i))
            self.assertEqual(read(view(i)), rc.view_bytes(orig[i], "fp16"))
        time.sleep(3.0)  # a snapshot the rescan trusts (class Rescan)
        before = mount.stats()
        zst = os.path.join(src, "p000.safetensors.zst")
        overflow(daemon, src, lambda: os.rename(
            os.path.join(work, "r.safetensors.zst"), zst))
        want = rc.view_bytes(replaced, "fp16")
        rc.poll(lambda: os.stat(view(0)).st_size == len(want), SETTLE,
                "the replaced pack to show after the overflow")
        self.assertIn("inotify queue overflowed", mount.output())
        self.assertEqual(read(view(0)), want)
        for i in range(1, self.N):
            self.assertEqual(read(view(i)), rc.view_bytes(orig[i], "fp16"))
        after = mount.stats()
        sent = after["entry_invalidations"] - before["entry_invalidations"]
        print("packs: %d kernel notifications after the overflow" % sent)
        # Changed: p000 (+ junk0, junk1). Every held pack invalidated
        # would be at least 2 per pack (the file and its view): 120.
        self.assertLess(sent, 30, (before, after))


class WatchCap(unittest.TestCase):
    def test_directories_beyond_the_cap(self):
        # Breadth first: the root, a/ and b/ (3), then 65533 directories
        # at depth 2 (65532 under a/, and b/x) fill the 65536 watches;
        # b/x/y and its 15 siblings at depth 3 are beyond the cap.
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            if int(f.read()) < 65536 + 4096:
                raise unittest.SkipTest("fs.inotify.max_user_watches is "
                                        "below the cap")
        # On tmpfs where there is one: 65552 directories on a loaded disk
        # take minutes to make and to scan.
        base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
        src = tempfile.mkdtemp(prefix="castfs-cap-", dir=base)
        try:
            self.cap_in(src)
        finally:
            subprocess.run(["rm", "-rf", "--", src], check=False)

    def cap_in(self, src):
        os.mkdir(os.path.join(src, "a"))
        for i in range(65532):
            os.mkdir(os.path.join(src, "a", "%05d" % i))
        deep = os.path.join(src, "b", "x", "y")
        os.makedirs(deep)
        for i in range(15):
            os.mkdir(os.path.join(src, "b", "x", "s%02d" % i))
        near = os.path.join(src, "b", "x", "c.safetensors")
        far = os.path.join(deep, "c.safetensors")
        rc.write_ckpt(near, seed=1)
        rc.write_ckpt(far, seed=2)
        timeout = 6
        with tl.Mount(src, options=["timeout=%d" % timeout]) as mount, \
                tl.caches_kept():  # the entry must live to its timeout
            rc.poll(lambda: "watching the first 65536" in mount.output(),
                    120, "the watch cap to be logged")
            mnear = mount.join("b", "x", rc.view_name("c", "fp16"))
            mfar = mount.join("b", "x", "y", rc.view_name("c", "fp16"))
            self.assertTrue(exists(mnear))
            self.assertTrue(exists(mfar))
            os.unlink(near)
            os.unlink(far)
            t0 = time.time()
            # Within the cap: the watcher drops the entry at once.
            rc.poll(lambda: not exists(mnear), SETTLE,
                    "a change within the cap to show")
            # Beyond it: when the entry timeout expires.
            rc.poll(lambda: not exists(mfar), timeout + SETTLE,
                    "a change beyond the cap to show after the timeout")
            took = time.time() - t0
        print("beyond the cap: gone after %.1f s (timeout %d s)"
              % (took, timeout))
        # Not at once: nothing watched that directory.
        self.assertGreater(took, timeout / 2)


class NoLease(unittest.TestCase):
    def test_fstat_fallback_without_cap_lease(self):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root to chown the source")
        if subprocess.run(["setpriv", "--bounding-set=-lease", "true"],
                          capture_output=True).returncode:
            raise unittest.SkipTest("setpriv cannot drop CAP_LEASE")
        with tl.tempdir() as src:
            os.chmod(src, 0o755)
            path = os.path.join(src, "c.safetensors")
            tensors = rc.write_ckpt(path, seed=1)
            os.chown(path, NOBODY, NOBODY)  # not the daemon's: no lease
            want = rc.view_bytes(tensors, "fp16")
            name = rc.view_name("c", "fp16")
            with tl.Mount(src, prefix=["setpriv", "--inh-caps=-lease",
                                       "--bounding-set=-lease"]) as mount:
                with open("/proc/%d/status" % mount.proc.pid) as f:
                    capbnd = [l for l in f if l.startswith("CapBnd:")][0]
                self.assertFalse(int(capbnd.split()[1], 16) & (1 << 28),
                                 "CAP_LEASE still in the daemon's set")
                fd = os.open(mount.join(name), os.O_RDONLY | os.O_DIRECT)
                try:
                    self.assertEqual(os.pread(fd, 4096, 0), want[:4096])
                    # A writer that changes nothing: no lease to break,
                    # so the open file keeps reading (under a lease it
                    # would fail with EIO, test_rel_lease).
                    wfd = os.open(path, os.O_WRONLY)
                    try:
                        self.assertEqual(os.pread(fd, 4096, 4096),
                                         want[4096:8192])
                        os.lseek(wfd, 0, os.SEEK_END)
                        os.write(wfd, b"\0" * 8)  # the size moves
                    finally:
                        os.close(wfd)
                    with self.assertRaises(OSError) as cm:
                        os.pread(fd, 4096, 8192)
                    self.assertEqual(cm.exception.errno, errno.EIO)
                finally:
                    os.close(fd)


if __name__ == "__main__":
    tl.main()
