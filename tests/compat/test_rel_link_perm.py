# SPDX-License-Identifier: MIT
"""A link inside the root gives the views of its target, but never to a
user the kernel would not let follow it: castfs reads the target itself,
so the directories the link leads through (below the link's own, which
the kernel searches anyway) are folded into the modes of everything
derived from it: views, tensor trees. Mounted with allow_other as root,
read as uid 65534; the view of the target reached directly keeps its own
mode and is another inode."""
import errno
import hashlib
import json
import os
import subprocess
import sys
import unittest

import castfs_testlib as tl
import rel_common as rc

NOBODY = 65534

PROBE = r"""
import errno, hashlib, json, sys
res = {}
for p in sys.argv[1:]:
    try:
        with open(p, "rb") as f:
            res[p] = hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        res[p] = errno.errorcode[e.errno]
print(json.dumps(res))
"""


def as_nobody(*paths):
    out = subprocess.run(
        ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
         "--clear-groups", sys.executable, "-c", PROBE] + list(paths),
        capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def sha(b):
    return hashlib.sha256(b).hexdigest()


class AllowOtherMount(unittest.TestCase):
    """A mount for the whole class, with allow_other, its mount point
    reachable by nobody; the class keeps its source's tempdir in cls.tmp."""

    @classmethod
    def mount_for_all(cls, src):
        cls.mount = tl.Mount(src, options=["allow_other"])
        os.chmod(cls.mount.tmp, 0o755)

    @classmethod
    def tearDownClass(cls):
        code = cls.mount.unmount()
        cls.tmp.__exit__(None, None, None)
        assert code == 0, "castfs exited with %d" % code


class LinkPermissions(AllowOtherMount):
    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (allow_other, setpriv)")
        cls.tmp = tl.tempdir()
        top = cls.tmp.__enter__()
        os.chmod(top, 0o755)
        cls.src = src = os.path.join(top, "src")
        for d, mode in (("", 0o755), ("private", 0o700), ("pub", 0o755)):
            os.makedirs(os.path.join(src, d), exist_ok=True)
            os.chmod(os.path.join(src, d), mode)
        cls.priv = rc.write_ckpt(os.path.join(src, "private", "ok.safetensors"), 1)
        cls.pub = rc.write_ckpt(os.path.join(src, "pub", "p.safetensors"), 2)
        cls.top_t = rc.write_ckpt(os.path.join(src, "m.safetensors"), 3)
        for f in ("private/ok", "pub/p", "m"):
            os.chmod(os.path.join(src, f + ".safetensors"), 0o644)
        links = {"priv": "private/ok.safetensors",
                 # through private/ and back: the kernel searches it too
                 "via": "private/../m.safetensors",
                 "publ": "pub/p.safetensors",
                 "chain": "publ.safetensors"}
        for name, target in links.items():
            os.symlink(target, os.path.join(src, name + ".safetensors"))
        # a link in the private directory: its own path is searched
        os.symlink("ok.safetensors", os.path.join(src, "private", "l.safetensors"))
        cls.mount_for_all(src)

    def m(self, *p):
        return self.mount.join(*p)

    def test_hidden_targets_stay_hidden(self):
        hidden = []
        for stem in ("priv", "via"):
            hidden += [stem + ".safetensors", rc.view_name(stem, "fp16"),
                       rc.view_name(stem, "fp32"), rc.view_name(stem, "nf4"),
                       stem + ".safetensors.tensors/norm.raw",
                       stem + ".safetensors.tensors/emb/weight.raw",
                       rc.view_name(stem, "fp16") + ".tensors/norm.raw"]
        got = as_nobody(*[self.m(p) for p in hidden])
        self.assertEqual(got, {self.m(p): "EACCES" for p in hidden})

    def test_open_targets_still_read(self):
        want = {}
        for stem in ("publ", "chain"):
            want[rc.view_name(stem, "fp16")] = sha(rc.view_bytes(self.pub, "fp16"))
            with open(os.path.join(self.src, "pub", "p.safetensors"), "rb") as f:
                want[stem + ".safetensors"] = sha(f.read())
        got = as_nobody(*[self.m(p) for p in want])
        self.assertEqual(got, {self.m(p): h for p, h in want.items()})
        tree = as_nobody(self.m("publ.safetensors.tensors", "norm.raw"))
        self.assertEqual(list(tree.values())[0],
                         sha(self.pub["norm"].numpy().tobytes()))

    def test_modes(self):
        modes = {rc.view_name("priv", "fp16"): 0o100400,
                 rc.view_name("via", "fp16"): 0o100400,
                 "priv.safetensors.tensors": 0o40500,
                 "priv.safetensors.tensors/norm.raw": 0o100400,
                 rc.view_name("publ", "fp16"): 0o100444,
                 "publ.safetensors.tensors": 0o40555,
                 "private/" + rc.view_name("l", "fp16"): 0o100444,
                 "private/" + rc.view_name("ok", "fp16"): 0o100444,
                 rc.view_name("m", "fp16"): 0o100444}
        for p, mode in modes.items():
            self.assertEqual(oct(os.stat(self.m(p)).st_mode), oct(mode), p)
        # The mask belongs to the path: looked up again after the
        # target's direct view, the link's view keeps it, as another
        # inode (the kernel keeps one mode per inode).
        link = os.stat(self.m(rc.view_name("priv", "fp16")))
        direct = os.stat(self.m("private", rc.view_name("ok", "fp16")))
        self.assertNotEqual(link.st_ino, direct.st_ino)
        self.assertEqual(link.st_mode & 0o777, 0o400)
        self.assertEqual(os.stat(self.m(rc.view_name("priv", "fp16"))).st_mode
                         & 0o777, 0o400)
        # Views of a target reached directly keep their inode numbers.
        self.assertEqual(os.stat(self.m(rc.view_name("publ", "fp16"))).st_ino,
                         os.stat(self.m("pub", rc.view_name("p", "fp16"))).st_ino)


class FolderGGUF(AllowOtherMount):
    """DIR.q8_0.gguf lies beside its folder, so the kernel never searches
    the folder to read it: a 0700 model folder's GGUF is for its owner's
    class only, as the folder's DIR.<view>/ is (a review: its weights
    were everyone's under allow_other); a link into a private blobs
    directory hides it too, and a public folder's GGUF stays readable."""

    @classmethod
    def setUpClass(cls):
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root (allow_other, setpriv)")
        from test_gguf_llm import make_model
        cls.tmp = tl.tempdir()
        top = cls.tmp.__enter__()
        os.chmod(top, 0o755)
        src = os.path.join(top, "src")
        os.mkdir(src)
        for name in ("priv", "pub", "lnk"):
            make_model(os.path.join(src, name), "llama")
        blobs = os.path.join(src, "blobs")
        os.mkdir(blobs)
        os.rename(os.path.join(src, "lnk", "model.safetensors"),
                  os.path.join(blobs, "m"))
        os.symlink("../blobs/m", os.path.join(src, "lnk", "model.safetensors"))
        for dp, dn, fn in os.walk(src):
            for x in dn:
                os.chmod(os.path.join(dp, x), 0o755)
            for x in fn:
                if not os.path.islink(os.path.join(dp, x)):
                    os.chmod(os.path.join(dp, x), 0o644)
        os.chmod(src, 0o755)
        os.chmod(os.path.join(src, "priv"), 0o700)
        os.chmod(blobs, 0o700)
        cls.mount_for_all(src)

    def test_folder_gguf(self):
        m = self.mount.join
        got = as_nobody(m("priv.q8_0.gguf"), m("lnk.q8_0.gguf"),
                        m("pub.q8_0.gguf"))
        self.assertEqual(got[m("priv.q8_0.gguf")], "EACCES")
        self.assertEqual(got[m("lnk.q8_0.gguf")], "EACCES")
        with open(m("pub.q8_0.gguf"), "rb") as f:
            self.assertEqual(got[m("pub.q8_0.gguf")], sha(f.read()))
        self.assertEqual(os.stat(m("priv.q8_0.gguf")).st_mode & 0o777, 0o400)
        self.assertEqual(os.stat(m("pub.q8_0.gguf")).st_mode & 0o777, 0o444)


if __name__ == "__main__":
    tl.main()
