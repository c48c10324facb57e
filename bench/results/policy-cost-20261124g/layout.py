"""README.md section 4: a toy kernel touching 9 int64 and 7 bool fields of each block of a launch and of the launches
1 and 20 later, over the last 2 000 launches of the standard GPT-2-large trace, with the fields as rows (by field,
as the policy keeps them) or as columns (by block); warm, and cold (64 MiB read before each launch). Run from the
repository root: python bench/results/policy-cost-20261124g/layout.py
"""
import os
import time

import numba as nb
import numpy as np

from uvmprefetch.sim.layout import build_layout
from uvmprefetch.trace import load
t = load(os.path.expanduser("~/.cache/uvmprefetch/traces/bba7259fa78f/gpt2-large.uvmt"))
lay = build_layout(t)
n = lay.max_blocks
L = lay.n_launches
ptr = lay.ptr.astype(np.int64)
blocks = lay.blocks.astype(np.int64)
lo = L - 2000


@nb.njit
def touch(bi, bb, ptr, blocks, lo, hi, out):
    """Each launch touches its blocks, those of the next launch (the advance) and those of launch i+20 (the window's
    entry): every field ``bi[f, b]`` / ``bb[f, b]`` of each, read and written. By block, the caller passes the
    ``(block, field)`` arrays transposed (the same kernel, strided)."""
    s = 0
    for i in range(lo, hi):
        for j in (i, i + 1, i + 20):
            if j >= hi:
                continue
            for e in range(ptr[j], ptr[j + 1]):
                b = blocks[e]
                for f in range(bi.shape[0]):
                    s += bi[f, b]
                    bi[f, b] = s & 1023
                for f in range(bb.shape[0]):
                    if bb[f, b]:
                        s += 1
                    bb[f, b] = (s & 1) == 1
    out[0] = s


@nb.njit
def flush(junk):
    s = 0
    for i in range(0, junk.shape[0], 8):
        s += junk[i]
    return s


out = np.zeros(1, np.int64)
junk = np.ones(64 << 17, np.int64)  # 64 MiB
for name, bi, bb in (("by field", np.zeros((9, n), np.int64), np.zeros((7, n), np.bool_)),
                     ("by block", np.zeros((n, 9), np.int64).T, np.zeros((n, 7), np.bool_).T),
                     ("by block, int32", np.zeros((n, 9), np.int32).T, np.zeros((n, 7), np.bool_).T),
                     ("by field, int32", np.zeros((9, n), np.int32), np.zeros((7, n), np.bool_))):
    touch(bi, bb, ptr, blocks, lo, lo + 10, out)
    for r in range(3):
        t0 = time.perf_counter()
        touch(bi, bb, ptr, blocks, lo, L, out)
        dt = time.perf_counter() - t0
        tc = 0.0  # cold: 64 MiB read before each launch
        for i in range(lo, lo + 300):
            flush(junk)
            t1 = time.perf_counter()
            touch(bi, bb, ptr, blocks, i, i + 1, out)
            tc += time.perf_counter() - t1
        print(f"{name:16s} {r}: warm {dt / (L - lo) * 1e6:.2f} us a launch, cold {tc / 300 * 1e6:.2f} us")
