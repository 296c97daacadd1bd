# SPDX-License-Identifier: MIT
"""test_casts.py's checks (every cast view against torch, the official
writer, ml_dtypes, ranges and mmap) with the daemon's kernels forced to the
scalar reference and to AVX2 (CASTFS_ISA), not only the best ISA the CPU
has. The daemon falls back to the best ISA when told one the CPU lacks, so
a CPU without AVX2 makes the AVX2 case a skip (exit 77), never a pass.
"""
import unittest

import castfs_testlib as tl
import test_casts as tc

# What castfs_cpu_detect() (lib/kernels/cpu.c) needs for its AVX2 table.
AVX2_FLAGS = {"avx", "avx2", "f16c", "fma"}  # Linux hides AVX without OS support


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class ForcedIsa(tc.CastViews):
    ISA = None

    @classmethod
    def setUpClass(cls):
        if cls.ISA == "avx2" and not AVX2_FLAGS <= cpu_flags():
            raise unittest.SkipTest("this CPU has no AVX2")
        cls.mount_env = {"CASTFS_ISA": cls.ISA}
        super().setUpClass()


class Scalar(ForcedIsa):
    ISA = "scalar"


class Avx2(ForcedIsa):
    ISA = "avx2"


del ForcedIsa  # only the concrete cases run

if __name__ == "__main__":
    tl.main()
