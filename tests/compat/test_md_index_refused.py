# SPDX-License-Identifier: MIT
"""A model directory whose *.safetensors.index.json castfs refuses (a
shard named by a path, "../x" or "/x"; a shard that is not there) or
one of whose shards castfs rejects (cut short) gets no DIR.<view>/ name: not
listed, a lookup answers ENOENT, and /.castfs/refused says why. Its
index's variant spellings (X.safetensors.index.<view>.json) are not
listed either. Rewriting the index while mounted makes the views appear
(the watcher invalidates; the check is cached per identity of the file),
and breaking it again hides them. A good neighbour keeps its views.

Oracles: the source files written here with safetensors/torch (the
rewritten index's weight_map must name the same shards as the source's,
a converted shard must equal torch's cast of the source tensors), and
the index text itself for what is refused.
"""
import errno
import json
import os
import unittest

import torch
from safetensors.torch import load_file, save_file

import castfs_testlib as tl
import rel_common as rc
from test_rel_containment import Inotify

SETTLE = 10.0  # seconds the watcher may take (it takes milliseconds)
INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors",
          "model-00002-of-00002.safetensors")
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "torch_dtype": "float32"}


def tensors():
    g = torch.Generator().manual_seed(17)
    return ({"a.weight": torch.randn(4, 8, generator=g)},
            {"b.weight": torch.randn(8, 4, generator=g),
             "c.bias": torch.randn(8, generator=g)})


def write_index(folder, weight_map, in_place=False):
    """The index of @folder; replaced by rename unless @in_place."""
    text = json.dumps({"metadata": {"total_size": 4 * (32 + 32 + 8)},
                       "weight_map": weight_map}, indent=2)
    p = os.path.join(folder, INDEX)
    if in_place:
        with open(p, "w") as f:
            f.write(text)
        return
    with open(p + ".tmp", "w") as f:
        f.write(text)
    os.rename(p + ".tmp", p)


def good_map():
    one, two = tensors()
    m = {k: SHARDS[0] for k in one}
    m.update({k: SHARDS[1] for k in two})
    return m


def make_model(folder, weight_map):
    os.mkdir(folder)
    for shard, t in zip(SHARDS, tensors()):
        save_file(t, os.path.join(folder, shard))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    write_index(folder, weight_map)


class IndexRefused(unittest.TestCase):
    def setUp(self):
        self._tmp = tl.tempdir()
        self.src = self._tmp.__enter__()
        make_model(os.path.join(self.src, "good"), good_map())
        bad = good_map()
        bad["a.weight"] = "../" + SHARDS[0]
        make_model(os.path.join(self.src, "dotdot"), bad)
        bad = good_map()
        bad["c.bias"] = "/" + SHARDS[1]
        make_model(os.path.join(self.src, "absolute"), bad)
        # a good index naming a shard that is not there (stop 39: its
        # DIR.<view>/ listed an index that failed at open, ENOENT, and
        # /.castfs/refused said nothing)
        make_model(os.path.join(self.src, "missing"), good_map())
        os.rename(os.path.join(self.src, "missing", SHARDS[1]),
                  os.path.join(self.src, SHARDS[1] + ".away"))
        # an index naming more shards than castfs reads (4096): it was
        # not checked for missing shards at all (stop 40)
        make_model(os.path.join(self.src, "many"), good_map())
        write_index(os.path.join(self.src, "many"),
                    {"t%d.weight" % i: "model-%05d-of-05000.safetensors" % i
                     for i in range(1, 5001)})
        # a shard cut short (a download in progress): it is rejected, and
        # its DIR.<view>/ listed the same failing index (stop 40)
        make_model(os.path.join(self.src, "truncated"), good_map())
        p = os.path.join(self.src, "truncated", SHARDS[1])
        os.truncate(p, os.path.getsize(p) // 2)

    def tearDown(self):
        self._tmp.__exit__(None, None, None)

    def refused(self, m, name):
        """The /.castfs/refused records of @name's DIR.<view>/ names
        (the GGUF views' records of the folder are another matter)."""
        with open(m.join(".castfs", "refused")) as f:
            return [r for r in json.load(f)
                    if r["path"] == name and "fp16" in r["views"]]

    def assert_served(self, m, name):
        """DIR.fp16/ of @name is listed and equals the oracle."""
        self.assertIn(name + ".fp16", os.listdir(m.join()))
        self.assertTrue(os.path.isdir(m.join(name + ".fp16")))
        with open(m.join(name + ".fp16", INDEX)) as f:
            self.assertEqual(json.load(f)["weight_map"], good_map())
        for shard, want in zip(SHARDS, tensors()):
            got = load_file(m.join(name + ".fp16", shard))
            self.assertEqual(sorted(got), sorted(want))
            for k, t in want.items():
                self.assertEqual(got[k].dtype, torch.float16)
                self.assertTrue(torch.equal(got[k], t.to(torch.float16)), k)
        self.assertIn("model.safetensors.index.fp16.json",
                      os.listdir(m.join(name)))

    def assert_refused(self, m, name, why, what=INDEX):
        names = os.listdir(m.join())
        self.assertIn(name, names)
        self.assertEqual([n for n in names if n.startswith(name + ".")], [])
        for view in ("fp16", "bf16", "fp8", "nf4"):
            with self.assertRaises(FileNotFoundError):
                os.stat(m.join(name + "." + view))
        # nor the variant spelling of the refused index
        vix = "model.safetensors.index.fp16.json"
        self.assertNotIn(vix, os.listdir(m.join(name)))
        with self.assertRaises(OSError) as cm:
            os.stat(m.join(name, vix))
        self.assertEqual(cm.exception.errno, errno.ENOENT)
        mine = self.refused(m, name)
        self.assertEqual(len(mine), 1, mine)
        self.assertIn("bf16", mine[0]["views"])
        self.assertTrue(mine[0]["reason"].startswith(what + ": "), mine)
        self.assertIn(why, mine[0]["reason"])

    def test_refused_index_not_listed_then_fixed(self):
        with tl.Mount(self.src) as m:
            self.assert_served(m, "good")
            self.assert_refused(m, "dotdot", "'a.weight'")
            self.assert_refused(m, "absolute", "'c.bias'")
            self.assert_refused(m, "missing", "shard %s is missing" % SHARDS[1])
            self.assert_refused(m, "truncated", "", what=SHARDS[1])
            self.assert_refused(m, "many", "names 5000 shards, more than")
            with open(m.join(".castfs", "rejected")) as f:
                self.assertIn("truncated/" + SHARDS[1],
                              [r["path"] for r in json.load(f)])
            # The download completed in place: the views appear.
            with open(os.path.join(self.src, "truncated", SHARDS[1]),
                      "r+b") as f:
                f.seek(0, os.SEEK_END)
                save_file(tensors()[1], os.path.join(self.src, "whole"))
                with open(os.path.join(self.src, "whole"), "rb") as w:
                    w.seek(f.tell())
                    f.write(w.read())
            rc.poll(lambda: "truncated.fp16" in os.listdir(m.join()), SETTLE,
                    "truncated.fp16 to be listed")
            self.assert_served(m, "truncated")
            self.assertEqual(self.refused(m, "truncated"), [])
            self.assertEqual(self.refused(m, "good"), [])
            # The shard back: the views appear.
            os.rename(os.path.join(self.src, SHARDS[1] + ".away"),
                      os.path.join(self.src, "missing", SHARDS[1]))
            rc.poll(lambda: "missing.fp16" in os.listdir(m.join()), SETTLE,
                    "missing.fp16 to be listed")
            self.assert_served(m, "missing")
            self.assertEqual(self.refused(m, "missing"), [])
            # Fixed while mounted: the views appear.
            write_index(os.path.join(self.src, "dotdot"), good_map())
            rc.poll(lambda: "dotdot.fp16" in os.listdir(m.join()), SETTLE,
                    "dotdot.fp16 to be listed")
            self.assert_served(m, "dotdot")
            self.assertEqual(self.refused(m, "dotdot"), [])
            # Broken again in place (same inode): hidden again.
            bad = good_map()
            bad["b.weight"] = "../x.safetensors"
            write_index(os.path.join(self.src, "dotdot"), bad,
                        in_place=True)
            rc.poll(lambda: "dotdot.fp16" not in os.listdir(m.join()),
                    SETTLE, "dotdot.fp16 to be hidden")
            rc.poll(lambda: not os.path.exists(m.join("dotdot.fp16")),
                    SETTLE, "dotdot.fp16 lookup to fail")
            self.assert_refused(m, "dotdot", "'b.weight'")
            # The neighbours are untouched.
            self.assert_served(m, "good")
            self.assert_refused(m, "absolute", "'c.bias'")

    def test_rewrite_keeping_size_and_mtime(self):
        """An index rewritten in place to the same size, its mtime then
        set back (what a coarse timestamp does by chance): the watcher's
        event, not the identity, makes castfs check it again."""
        d = os.path.join(self.src, "good")
        p = os.path.join(d, INDEX)
        with tl.Mount(self.src) as m:
            self.assert_served(m, "good")
            before = os.stat(p)
            bad = good_map()
            bad["a.weight"] = "/" + SHARDS[0][1:]  # the same length
            write_index(d, bad, in_place=True)
            os.utime(p, ns=(before.st_atime_ns, before.st_mtime_ns))
            after = os.stat(p)
            self.assertEqual((after.st_ino, after.st_size, after.st_mtime_ns),
                             (before.st_ino, before.st_size,
                              before.st_mtime_ns))
            rc.poll(lambda: "good.fp16" not in os.listdir(m.join()),
                    SETTLE, "good.fp16 to be hidden")
            self.assert_refused(m, "good", "'a.weight'")

    def test_index_read_once_per_identity(self):
        """Listings after the first read no index again (the check is
        cached per identity); a rewrite is read once more."""
        watches = {n: Inotify(os.path.join(self.src, n))
                   for n in ("good", "dotdot")}
        try:
            with tl.Mount(self.src) as m:
                os.listdir(m.join())
                opened = {n: [e for e in w.events() if e[1] == INDEX]
                          for n, w in watches.items()}
                # control: the first listing did read both indexes
                self.assertNotEqual(opened["good"], [])
                self.assertNotEqual(opened["dotdot"], [])
                for _ in range(5):
                    names = os.listdir(m.join())
                    self.assertIn("good.fp16", names)
                    self.assertNotIn("dotdot.fp16", names)
                for n, w in watches.items():
                    self.assertEqual(
                        [e for e in w.events() if e[1] == INDEX], [], n)
        finally:
            for w in watches.values():
                w.close()


if __name__ == "__main__":
    tl.main()
