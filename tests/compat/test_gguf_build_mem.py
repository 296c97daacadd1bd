# SPDX-License-Identifier: MIT
"""Every DIR.<q>.gguf of a model folder asked for at once (what `ls -l` of
the folder's parent does on the daemon's workers) costs the daemon about
two builds' memory, not one per view.

Each build parses tokenizer.json with cJSON (~80 bytes a JSON value); the
views were built separately and all at once, so seven builds of a
4 M-value tokenizer peaked at 668 MB, and glibc kept it afterwards (a bug
hunt). Now at most two GGUF builds run at once in the mount, requests for
one view share its build, and a build that read over 1 MiB of text gives
the freed heap back.

Three model folders here, whose tokenizer is the one make_model() trains
with 600,000 more JSON values beside its keys (the tokenizer ignores
them; cJSON does not): one build costs tens of MB. Oracles: the first build's own growth, measured in
the same mount; `castfs convert` of the folder, view by view, for the
bytes; /.castfs/stats for the builds.
"""
import hashlib
import os
import random
import shutil
import subprocess
import threading
import unittest

import castfs_testlib as tl
from test_gguf_llm import make_model

VIEWS = ["f16", "bf16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"]
FILLER = 600000  # JSON values added to tokenizer.json
FOLDERS = ["m0", "m1", "m2"]
FIRST = "m0.q8_0.gguf"  # built alone first: one build's growth
THREADS = 8  # statting threads, and the daemon's workers
LINKS = "links"  # LINKED/h/: folders of hard links to m0's files
LINKED = ["d%d" % i for i in range(THREADS)]


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class GGUFBuildMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tl.tempdir()
        cls.src = cls._tmp.__enter__()
        first = os.path.join(cls.src, FOLDERS[0])
        make_model(first, "llama")
        tok = os.path.join(first, "tokenizer.json")
        with open(tok) as f:
            text = f.read().rstrip()
        with open(tok, "w") as f:
            f.write(text[:-1] + ', "x": [' + "0," * (FILLER - 1) + "0]}")
        for d in FOLDERS[1:]:
            shutil.copytree(first, os.path.join(cls.src, d))
        # Folders of hard links to m0's files, each in a directory of its
        # own (LINKED), all under LINKS so the test above never lists them.
        for d in LINKED:
            dst = os.path.join(cls.src, LINKS, d, "h")
            os.makedirs(dst)
            for f in os.listdir(first):
                os.link(os.path.join(first, f), os.path.join(dst, f))

    @classmethod
    def tearDownClass(cls):
        cls._tmp.__exit__(None, None, None)

    def stat_all_at_once(self, m, names):
        """Each of THREADS threads stats every name, in its own order,
        all starting together; the names that exist."""
        start = threading.Barrier(THREADS)
        found, errors = set(), []

        def run(seed):
            order = names[:]
            random.Random(seed).shuffle(order)
            start.wait()
            for v in order:
                try:
                    os.stat(m.join(v))
                    found.add(v)
                except FileNotFoundError:
                    pass
                except OSError as e:  # pragma: no cover - reported below
                    errors.append((v, e))

        ts = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        return found

    def test_views_at_once_cost_two_builds(self):
        opts = ["views=" + ":".join(v + ".gguf" for v in VIEWS),
                "threads=%d" % THREADS]
        names = ["%s.%s.gguf" % (d, v) for d in FOLDERS for v in VIEWS]
        with tl.Mount(self.src, options=opts) as m:
            pid = m.daemon()
            for d in FOLDERS:
                os.stat(m.join(d))
            base = tl.rss_mb(pid, "VmHWM")
            os.stat(m.join(FIRST))
            one = tl.rss_mb(pid, "VmHWM") - base
            built = m.stats()["plans_built"]
            found = self.stat_all_at_once(m, names)
            peak = tl.rss_mb(pid, "VmHWM") - base
            builds = m.stats()["plans_built"] - built
            # one build per file not built yet, however many asked
            self.assertIn(FIRST, found)
            self.assertGreaterEqual(len(found), 4 * len(FOLDERS), found)
            self.assertEqual(builds, len(found) - 1)
            self.assertTrue(found <= set(os.listdir(m.path)))
            got = {n: digest(m.join(n)) for n in found}
            print("one build +%.1f MB, %d files at once +%.1f MB (%.2fx)" %
                  (one, len(found) - 1, peak, peak / one))
            if not tl.sanitizer(pid):
                self.assertGreater(one, 20)
                self.assertLess(peak, 2.5 * one)
        # the bytes: castfs convert of the folder, view by view
        for v in VIEWS:
            n = "%s.%s.gguf" % (FOLDERS[0], v)
            if n not in found:
                continue
            out = os.path.join(self.src, "out.gguf")
            subprocess.run([tl.castfs_binary(), "convert",
                            os.path.join(self.src, FOLDERS[0]), "--view", v,
                            "-o", out, "--no-progress"], check=True)
            self.assertEqual(digest(out), got[n], n)
            for d in FOLDERS[1:]:
                self.assertEqual(got["%s.%s.gguf" % (d, v)], got[n], (d, v))
            os.unlink(out)

    def test_one_build_through_many_names(self):
        """Requests that reach one outcome through different names share
        its build. The kernel merges concurrent lookups of one name, and
        serializes lookups in one directory (libfuse 3.14 does not pass
        FUSE_PARALLEL_DIROPS on), so the names here are in different
        directories: links/d<i>/h.q8_0.gguf of folders of hard links to
        the same files are one checkpoint entry and one dep (the
        identities of the same text files), hence one entry of its GGUF
        cache, asked for by THREADS lookups at once. Without the entry's
        single flight each lookup builds (two at a time, the gate)."""
        opts = ["views=q8_0.gguf", "threads=%d" % THREADS]
        names = ["%s/%s/h.q8_0.gguf" % (LINKS, d) for d in LINKED]
        with tl.Mount(self.src, options=opts) as m:
            for d in LINKED:
                os.stat(m.join(LINKS, d))
            start = threading.Barrier(THREADS)
            sizes, errors = {}, []

            def run(name):
                start.wait()
                try:
                    sizes[name] = os.stat(m.join(name)).st_size
                except OSError as e:  # pragma: no cover - reported below
                    errors.append((name, e))

            ts = [threading.Thread(target=run, args=(n,)) for n in names]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(m.stats()["plans_built"], 1)
            self.assertEqual(len(set(sizes.values())), 1, sizes)
            got = digest(m.join(names[-1]))
        out = os.path.join(self.src, "out.gguf")
        subprocess.run([tl.castfs_binary(), "convert",
                        os.path.join(self.src, FOLDERS[0]), "--view",
                        "q8_0", "-o", out, "--no-progress"], check=True)
        self.assertEqual(digest(out), got)
        os.unlink(out)


if __name__ == "__main__":
    tl.main()
