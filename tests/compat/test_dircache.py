# SPDX-License-Identifier: MIT
"""Kernel-cached directory listings follow the source (docs/RELIABILITY.md,
"Scale and resource bounds"; docs/ARCHITECTURE.md, "The daemon").

castfs lets the kernel keep the listing of a source directory and of a
model-directory view (FOPEN_CACHE_DIR): a second listing is answered by
the kernel without a READDIR (checked first, through /.castfs/stats, so
that the rest tests the cache and not a fresh listing). Each change below
is made after the directory was listed (its listing cached) and without
any lookup of the changed name (os.listdir looks nothing up), so the
kernel holds no dentry of it and only the daemon's listing invalidation
can make the next listing show the change: without it, the source
directory's polls time out. (The model-directory case follows without it
too, the kernel dropping its listings when told about the view's name,
which listing it looked up; it checks that the cache keeps up.) The oracle is the source directory itself (what exists, and whether
a file is a valid safetensors file: the safetensors library wrote it)."""
import json
import os
import unittest

import numpy as np
from safetensors.numpy import save

import castfs_testlib as tl
import rel_common as rc

SETTLE = 20.0  # seconds the watcher may take on a loaded machine


def blob():
    return save({"w": np.arange(4, dtype=np.float32)})


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def requests(m, op):
    with open(m.join(".castfs", "stats")) as f:
        st = json.load(f)
    return st.get("requests", st)[op]


def listing(m, *p):
    return set(os.listdir(m.join(*p)))


def listed_twice(m, *p):
    """Two listings of @p in a row, and the READDIRs the second one made."""
    first = listing(m, *p)
    before = requests(m, "readdir")
    second = listing(m, *p)
    return first, second, requests(m, "readdir") - before


class ListingCase(unittest.TestCase):
    """A source directory per test, and listings checked to be kept."""

    def setUp(self):
        self.tmp = tl.tempdir()
        self.src = self.tmp.__enter__()

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def cached(self, m, *p):
        """List @p twice: the second listing must come from the kernel."""
        first, second, readdirs = listed_twice(m, *p)
        self.assertEqual(second, first)
        self.assertEqual(readdirs, 0,
                         "the second listing of %s was read from the "
                         "daemon" % "/".join(p))
        return first


class TestDirCache(ListingCase):
    def setUp(self):
        super().setUp()
        write(os.path.join(self.src, "a.safetensors"), blob())

    def shows(self, m, want, gone=(), *p):
        """The next listing of @p holds every name of @want and none of
        @gone; each listing is cached again before the next change.

        A write in place is several inotify events (create, modify,
        close); the watcher may apply them in two batches, each dropping
        the kernel's listing, so the name can show before the last one
        lands: the listing must be kept again once it has (two listings
        in a row, the second not read from the daemon), within SETTLE."""
        rc.poll(lambda: (set(want) <= listing(m, *p) and
                         not set(gone) & listing(m, *p)), SETTLE,
                "%s, without %s, in the listing" % (sorted(want),
                                                    sorted(gone)))
        rc.poll(lambda: self.kept(m, *p), SETTLE,
                "the listing of %s kept by the kernel" % "/".join(p))

    def kept(self, m, *p):
        """Whether a listing of @p right after another was the kernel's."""
        first, second, readdirs = listed_twice(m, *p)
        return second == first and readdirs == 0

    def test_source_directory(self):
        src = self.src
        with tl.Mount(src) as m, tl.caches_kept():
            names = self.cached(m)
            self.assertIn("a.safetensors", names)
            self.assertIn("a.fp8.safetensors", names)
            # Added.
            write(os.path.join(src, "b.safetensors"), blob())
            self.shows(m, {"b.safetensors", "b.fp8.safetensors"})
            # Removed.
            os.unlink(os.path.join(src, "a.safetensors"))
            self.shows(m, (), {"a.safetensors", "a.fp8.safetensors"})
            # Renamed.
            os.rename(os.path.join(src, "b.safetensors"),
                      os.path.join(src, "c.safetensors"))
            self.shows(m, {"c.safetensors", "c.fp8.safetensors"},
                       {"b.safetensors", "b.fp8.safetensors"})
            # Made invalid: still there, passed through, but no view.
            write(os.path.join(src, "c.safetensors"), b"not safetensors")
            self.shows(m, {"c.safetensors"}, {"c.fp8.safetensors"})
            self.assertEqual(listing(m), set(os.listdir(src)) |
                             {".castfs"})

    def test_model_directory(self):
        d = os.path.join(self.src, "m")
        os.mkdir(d)
        write(os.path.join(d, "model.safetensors"), blob())
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "llama", "torch_dtype": "float32"}, f)
        with tl.Mount(self.src) as m, tl.caches_kept():
            self.assertIn("m.bf16", self.cached(m))
            self.assertEqual(self.cached(m, "m.bf16"),
                             {"config.json", "model.safetensors"})
            # A file added to the folder shows in its view.
            write(os.path.join(d, "extra.safetensors"), blob())
            self.shows(m, {"extra.safetensors"}, (), "m.bf16")
            # Without config.json the folder has no views any more.
            os.unlink(os.path.join(d, "config.json"))
            self.shows(m, {"m"}, {"m.bf16", "m.fp8"})


if __name__ == "__main__":
    tl.main()
