# SPDX-License-Identifier: MIT
"""The harness's own verdicts (castfs_testlib.summary): a skipped case is a
SKIP (77), never a pass; failing subtests never make the percentage
negative (CI's summary reader drops such lines); nothing run is a failure.
Each inner suite is run for real by unittest, not simulated.
"""
import io
import os
import re
import unittest

import castfs_testlib as tl


def inner_cases():
    """The suites whose verdicts are tested (defined here so that the
    loader of this file does not run them as its own)."""

    class _Pass(unittest.TestCase):
        def test_a(self):
            self.assertTrue(True)


    class _Skip(unittest.TestCase):
        def test_a(self):
            self.assertTrue(True)

        def test_b(self):
            raise unittest.SkipTest("no such thing here")


    class _ManySubFails(unittest.TestCase):
        def test_a(self):
            for i in range(5):
                with self.subTest(i=i):
                    self.assertEqual(i, -1)

        def test_b(self):
            self.assertTrue(True)


    class _FailAndSkip(unittest.TestCase):
        def test_a(self):
            self.fail("no")

        def test_b(self):
            self.skipTest("skipped")

    return {c.__name__: c for c in (_Pass, _Skip, _ManySubFails,
                                    _FailAndSkip)}


CASES = inner_cases()


def run(case):
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case)
    return unittest.TextTestRunner(stream=io.StringIO()).run(suite)


class TestSummary(unittest.TestCase):

    def verdict(self, case):
        line, rc = tl.summary(run(case))
        self.assertRegex(line, r"^[0-9]+%: Checks: ")
        return int(re.match(r"(\d+)%", line).group(1)), rc

    def test_pass(self):
        self.assertEqual(self.verdict(CASES["_Pass"]), (100, 0))

    def test_skip_is_77(self):
        self.assertEqual(self.verdict(CASES["_Skip"]), (50, tl.SKIP))

    def test_subtest_failures_never_negative(self):
        self.assertEqual(self.verdict(CASES["_ManySubFails"]), (50, 1))

    def test_failure_wins_over_skip(self):
        self.assertEqual(self.verdict(CASES["_FailAndSkip"]), (0, 1))

    def test_nothing_run_fails(self):
        line, rc = tl.summary(unittest.TextTestRunner(
            stream=io.StringIO()).run(unittest.TestSuite()))
        self.assertEqual(rc, 1)
        self.assertTrue(line.startswith("0%: Checks: 0"))


class TestModuleSource(unittest.TestCase):
    """The shared setUpModule fixture: populated folder, then gone."""

    def test_populates_then_removes(self):
        env = tl.ModuleSource()
        if not tl.fuse_usable():
            self.assertRaises(unittest.SkipTest, env.start, None)
            return
        env.start(lambda src: open(os.path.join(src, "a"), "w").close())
        src = env.src
        self.assertEqual(os.listdir(src), ["a"])
        env.stop()
        self.assertFalse(os.path.exists(src))
        self.assertIsNone(env.src)
        env.stop()  # a second stop, or one after a skip, does nothing


if __name__ == "__main__":
    tl.main()
