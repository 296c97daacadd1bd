# SPDX-License-Identifier: MIT
"""The plans of DIR.<q>.gguf count against the checkpoint cache's budget
(-o cache_mb), like the single-file views' plans: past it, an entry
nothing uses is evicted, one only the kernel's nodes hold gives its plans
back, and they are built again on need (docs/RELIABILITY.md, "Scale and
resource bounds"). Each GGUF plan holds the file's whole header, the
folder's texts in it: with a big chat template or tokenizer, megabytes
per view. Before, they were held outside the account for the life of the
checkpoint entry, so `ls -l` of many such folders kept every header.

Each folder here has a chat_template.jinja of TEMPLATE_MB (a jinja
comment), which every view's header holds as tokenizer.chat_template.
Oracles: gguf-py's GGUFReader for the template in the file, `castfs
convert` of the folder for every view's bytes, /.castfs/stats "memory"
for the account and the daemon's RSS for what it holds.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import unittest

from gguf import GGUFReader

import castfs_testlib as tl
from test_gguf_llm import make_model

TEMPLATE_MB = 4
TEMPLATE = "{# " + "x" * ((TEMPLATE_MB << 20) - 6) + " #}"
VIEWS = ["q8_0", "q4_0", "f16", "bf16"]
FOLDERS = ["m%d" % i for i in range(6)]
BUDGET_MB = 16


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


Env = tl.ModuleSource()


def populate(src):
    first = os.path.join(src, FOLDERS[0])
    make_model(first, "llama")
    with open(os.path.join(first, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)
    for d in FOLDERS[1:]:
        shutil.copytree(first, os.path.join(src, d))


def setUpModule():
    Env.start(populate)


def tearDownModule():
    Env.stop()


def options(budget_mb=None):
    o = ["nosupervise", "views=" + ":".join(v + ".gguf" for v in VIEWS)]
    return o + (["cache_mb=%d" % budget_mb] if budget_mb else [])


class GGUFBudget(unittest.TestCase):
    def test_1_a_view_is_charged(self):
        """One view looked up: the cache's account holds its header."""
        with tl.Mount(Env.src, options=options()) as m:
            before = m.stats()["memory"]["cache_bytes"]
            os.stat(m.join(FOLDERS[0] + ".q8_0.gguf"))
            after = m.stats()["memory"]["cache_bytes"]
            self.assertGreaterEqual(after - before, len(TEMPLATE))

    def test_2_many_views_stay_within_the_budget(self):
        """`ls -l` of every view of every folder: the kernel holds a node
        of each, so the entries stay, and past the budget they give their
        plans back (the most recent entry keeps its own)."""
        names = ["%s.%s.gguf" % (d, v) for d in FOLDERS for v in VIEWS]
        with tl.Mount(Env.src, options=options(BUDGET_MB)) as m:
            pid = m.proc.pid
            for d in FOLDERS:
                os.stat(m.join(d))
            idle = tl.rss_mb(pid)
            with tl.caches_kept():  # the kernel must hold the nodes
                ls = subprocess.run(["ls", "-l", m.path], check=True,
                                    capture_output=True, text=True).stdout
                held = tl.rss_mb(pid) - idle
                mem = m.stats()["memory"]
            for n in names:
                self.assertIn(n, ls)
            every = len(names) * TEMPLATE_MB
            sys.stderr.write("ls -l of %d views of %d MB headers: +%.1f MB "
                             "RSS, cache %.1f MB (budget %d MB), %d builds\n"
                             % (len(names), TEMPLATE_MB, held,
                                mem["cache_bytes"] / 2**20, BUDGET_MB,
                                m.stats()["plans_built"]))
            with self.subTest("cache accounting"):
                # The budget, and past it one entry (a folder's views) at
                # most; within it, the headers are counted.
                self.assertLessEqual(mem["cache_bytes"],
                                     (BUDGET_MB + 2 * len(VIEWS) *
                                      TEMPLATE_MB) << 20)
                self.assertGreaterEqual(mem["cache_bytes"], len(TEMPLATE))
            with self.subTest("RSS"):
                if tl.sanitizer(pid):
                    self.skipTest("RSS not checked under %s"
                                  % tl.sanitizer(pid))
                # Kept, every header: 96 MB here.
                self.assertLess(held, every / 2)
            # What was given back is built again, exactly.
            got = {n: digest(m.join(n)) for n in names}
            r = GGUFReader(m.join(names[0]))
            tmpl = r.fields["tokenizer.chat_template"].contents()
            del r  # it maps the file, which would keep the mount busy
            self.assertEqual(tmpl, TEMPLATE)
        out = os.path.join(Env.src, "out.gguf")
        for v in VIEWS:
            subprocess.run([tl.castfs_binary(), "convert",
                            os.path.join(Env.src, FOLDERS[0]), "--view", v,
                            "-o", out, "--no-progress"], check=True)
            want = digest(out)
            os.unlink(out)
            for d in FOLDERS:
                self.assertEqual(got["%s.%s.gguf" % (d, v)], want, (d, v))


if __name__ == "__main__":
    tl.main()
