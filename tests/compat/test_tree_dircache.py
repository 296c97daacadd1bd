# SPDX-License-Identifier: MIT
"""Tensor-tree listings cached by the kernel, and failed views unlisted
(issue 17; docs/TENSOR_TREE.md "Listings", docs/RELIABILITY.md).

- A directory of a tensor tree (X.safetensors.tensors/ and the same of a
  view) is listed by the daemon once: a second listing is answered by the
  kernel (FOPEN_CACHE_DIR), which /.castfs/stats shows (no READDIR).
- A rewrite in place that changes the tensor names but keeps the file's
  size and mtime: until stop 42 the tree directories kept their node ids
  (they hash the source's identity, which lacked the ctime), and the
  daemon dropping the kernel's cached listings of the held directories
  (open, or a shell's cwd) made them show the new names. The ctime is
  now part of the identity: the new version's trees have new ids, a
  lookup lists the new names, and a directory held from the old version
  lists the old names or fails ESTALE, never the new ones (the old
  version's ids would mix two versions in one tree). The same through a
  hard link (per-path trees of one file).
- A tree listed again after its checkpoint's cache entry was evicted
  lists the same names and inode numbers.
- A view whose build fails (nf4 of a file with 200,000 tensors: its header
  would pass the 100 MB cap) is not listed, and its name answers ENOENT
  to stat and open like any name a listing does not show, the first time
  too (it used to answer E2BIG).

The oracles are the tensor names the safetensors library wrote (split at
dots as docs/TENSOR_TREE.md says, checked by name here) and the
source directory's listing."""
import errno
import json
import os
import time

import torch
from safetensors.torch import save_file

import castfs_testlib as tl
import rel_common as rc
from test_dircache import ListingCase, listing, requests

SETTLE = 20.0  # seconds the watcher may take on a loaded machine


def leaves(stem):
    return {stem + s for s in (".info", ".npy", ".raw")}


def write_pair(path, second):
    """Tensors "x.<second>" and "y.w": the same sizes and name lengths
    whatever @second (one letter), so the same file size."""
    save_file({"x." + second: torch.arange(4, dtype=torch.float32),
               "y.w": torch.ones(2, dtype=torch.float16)}, path)


class TestTreeDirCache(ListingCase):

    def test_listed_once_and_dropped_on_rewrite_in_place(self):
        path = os.path.join(self.src, "m.safetensors")
        write_pair(path, "a")
        # No test of the run drops the kernel's caches meanwhile: that
        # would drop the kept listings too, and the rewrite case could
        # pass without the daemon's word.
        with tl.Mount(self.src) as m, tl.caches_kept():
            trees = ("m.safetensors.tensors", "m.fp16.safetensors.tensors")
            for t in trees:
                self.assertLessEqual({"x", "y"}, self.cached(m, t))
                self.assertEqual(self.cached(m, t, "x"), leaves("a"))
                self.assertEqual(self.cached(m, t, "y"), leaves("w"))
            # Many listings, one READDIR between them all: none.
            before = requests(m, "readdir")
            for _ in range(20):
                for t in trees:
                    listing(m, t, "x")
            self.assertEqual(requests(m, "readdir"), before)

            # Held open, as a shell's cwd holds it: the kernel keeps the
            # directories' inodes, with their cached listings, after the
            # watcher dropped the tree's name (an inode nobody holds is
            # forgotten with its listing, and would pass without the
            # daemon dropping the listing).
            self.rewrite_seen_held(m, path, trees)

    def rewrite_seen_held(self, m, path, trees):
        """rewrite_seen() with @trees and their x/, y/ held open."""
        held = [os.open(m.join(t, *sub), os.O_RDONLY | os.O_DIRECTORY)
                for t in trees for sub in ((), ("x",), ("y",))]
        try:
            self.rewrite_seen(m, path, trees, held)
        finally:
            for fd in held:
                os.close(fd)

    def rewrite_seen(self, m, path, trees, held):
        """Rewrite @path in place with other names and the same size
        and mtime; the listings of @trees (directories @held) follow."""
        # The same size and mtime, other names: in place.
        held_ino = [os.fstat(fd).st_ino for fd in held]
        old = os.stat(path)
        write_pair(path + ".tmp", "b")
        with open(path + ".tmp", "rb") as f:
            data = f.read()
        os.unlink(path + ".tmp")
        self.assertEqual(len(data), old.st_size)
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))
        now = os.stat(path)
        self.assertEqual((now.st_ino, now.st_size, now.st_mtime_ns),
                         (old.st_ino, old.st_size, old.st_mtime_ns))
        # A lookup reaches the new version (the watcher dropped the
        # names), under new node ids; the held directories are the old
        # version's.
        def new_listed(t):
            try:
                return listing(m, t, "x") == leaves("b") or None
            except OSError as e:  # a name the watcher has not dropped yet
                if e.errno != errno.ESTALE:
                    raise
                return None
        for i, t in enumerate(trees):
            rc.poll(lambda: new_listed(t), SETTLE,
                    "%s/x to list the new tensor" % t)
            self.assertNotEqual(os.stat(m.join(t, "x")).st_ino,
                                held_ino[3 * i + 1])
            try:
                old_names = set(os.listdir(held[3 * i + 1]))
            except OSError as e:
                self.assertEqual(e.errno, errno.ESTALE)
            else:
                self.assertEqual(old_names, leaves("a"))
            # ... and the new one is cached as before.
            self.assertEqual(self.cached(m, t, "x"), leaves("b"))
            self.assertEqual(self.cached(m, t, "y"), leaves("w"))

    def test_hard_link_trees_follow_a_rewrite(self):
        """Two hard links of one file have two trees (per-path ids); a
        rewrite in place through one of them drops the kernel's listings
        of both (matched by dev and ino)."""
        path = os.path.join(self.src, "m.safetensors")
        write_pair(path, "a")
        os.link(path, os.path.join(self.src, "l.safetensors"))
        # No test of the run drops the kernel's caches meanwhile: that
        # would drop the kept listings too, and the rewrite case could
        # pass without the daemon's word.
        with tl.Mount(self.src) as m, tl.caches_kept():
            trees = ("m.safetensors.tensors", "l.safetensors.tensors")
            ids = set()
            for t in trees:
                self.assertEqual(self.cached(m, t, "x"), leaves("a"))
                ids.add(os.stat(m.join(t, "x")).st_ino)
            self.assertEqual(len(ids), 2)
            self.rewrite_seen_held(m, path, trees)

    def test_evicted_header_lists_the_same(self):
        """A listing read again after the checkpoint's cache entry was
        evicted (a 1 MB budget, two files of 1.5 MB headers, evicted
        once the kernel forgot their trees' nodes) has the same
        names and inode numbers as the one the kernel kept: its ids hash
        the identity, not the parse."""
        names = {}
        for stem in ("a", "b"):
            names[stem] = {"%s%05d.w" % (stem, i) for i in range(20000)}
            save_file({n: torch.zeros(2, dtype=torch.float16)
                       for n in names[stem]},
                      os.path.join(self.src, stem + ".safetensors"))
        with tl.Mount(self.src, options=["cache_mb=1"]) as m:
            def entries(t):
                with os.scandir(m.join(t)) as it:
                    return {(e.name, e.inode()) for e in it}
            first = entries("a.safetensors.tensors")
            self.assertEqual({n for n, _ in first},
                             {n.split(".")[0] for n in names["a"]} |
                             {"__metadata__.json"})
            self.cached(m, "a.safetensors.tensors")
            self.assertEqual(entries("b.safetensors.tensors") and
                             entries("a.safetensors.tensors"), first)
            parsed = m.stats()["headers_parsed"]
            # The kernel forgets the trees' nodes (then the entries, past
            # the budget, are evicted) and its copies of the listings;
            # the daemon lists again from a header it parses again. The
            # FORGETs reach the daemon after drop_caches returns: a
            # listing before them finds the entry still held, so again
            # until one was parsed anew (every listing must be the same).
            deadline = time.monotonic() + SETTLE
            while True:
                tl.drop_caches(3)
                time.sleep(0.5)
                before = requests(m, "readdir")
                self.assertEqual(entries("a.safetensors.tensors"), first)
                self.assertGreater(requests(m, "readdir"), before)
                if m.stats()["headers_parsed"] > parsed:
                    break
                self.assertLess(time.monotonic(), deadline,
                                "the evicted header was never parsed again")

    def test_failed_view_answers_enoent(self):
        path = os.path.join(self.src, "huge.safetensors")
        # 200,000 tensors: the nf4 view's header would be about 109 MB,
        # past the 100 MB cap; the source's own is 16 MB.
        save_file({"t%06d.weight" % i: torch.zeros((1, 64),
                                                   dtype=torch.bfloat16)
                   for i in range(200000)}, path)
        name = "huge.nf4.safetensors"
        with tl.Mount(self.src) as m:
            names = listing(m)
            self.assertIn("huge.safetensors", names)
            self.assertIn("huge.bf16.safetensors", names)
            if name not in names:
                self.skipTest("nf4 is not a listed view of this mount")
            # The first use learns that it cannot be built.
            for use in (os.stat, lambda p: open(p, "rb").close()):
                with self.assertRaises(OSError) as cm:
                    use(m.join(name))
                self.assertEqual(cm.exception.errno, errno.ENOENT,
                                 os.strerror(cm.exception.errno))
            rc.poll(lambda: name not in listing(m), SETTLE,
                    "the listing to drop %s" % name)
            self.assertEqual(listing(m), names - {name})
            with self.assertRaises(FileNotFoundError):
                os.stat(m.join(name))
            # Not silently: /.castfs/refused names the file, the view and
            # the errno (E2BIG: the header would pass the cap).
            with open(m.join(".castfs", "refused")) as f:
                refused = json.load(f)
            mine = [r for r in refused if r["path"] == "huge.safetensors"]
            self.assertEqual(len(mine), 1, refused)
            self.assertIn("nf4", mine[0]["views"])
            self.assertNotIn("bf16", mine[0]["views"])
            self.assertIn(os.strerror(errno.E2BIG), mine[0]["reason"])
            # Its neighbours are served.
            self.assertGreater(os.stat(m.join("huge.bf16.safetensors"))
                               .st_size, 0)


if __name__ == "__main__":
    tl.main()
