#!/bin/sh
# SPDX-License-Identifier: MIT
# The kernel-dependent unit suites with CASTFS_ISA=avx512 (see per_isa.sh);
# exit 77 (SKIP) where this CPU or build has no avx512.
exec "${SHELL:-/bin/sh}" "$(dirname "$0")/per_isa.sh" avx512
