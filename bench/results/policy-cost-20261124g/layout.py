"""README.md section 4: a toy kernel touching 9 int64 and 7 bool fields of each block of a launch and of the launches
1 and 20 later, over the last 2 000 launches of the standard GPT-2-large trace, with the fields as rows (by field,
as the policy keeps them) or as columns (by block); warm, and cold (64 MiB read before each launch). Run from the
repository root: python bench/results/policy-cost-20261124g/layout.py
"""
import os
import time

import numba as nb
import numpy as np

from uvmprefetch.trace import load
from uvmprefetch.sim.layout import build_layout
t = load(os.path.expanduser('~/.cache/uvmprefetch/traces/bba7259fa78f/gpt2-large.uvmt'))
lay = build_layout(t)
n = lay.max_blocks
L = lay.n_launches
ptr = lay.ptr.astype(np.int64); blocks = lay.blocks.astype(np.int64)
lo = L - 2000
# each launch touches its blocks, those of the next launch (the advance) and those of launch i+20 (the window's entry)
@nb.njit
def soa(bi, bb, ptr, blocks, lo, hi, out):
    s = 0
    for i in range(lo, hi):
        for j in (i, i+1, i+20):
            if j >= hi: continue
            for e in range(ptr[j], ptr[j+1]):
                b = blocks[e]
                for f in range(bi.shape[0]):
                    s += bi[f, b]
                    bi[f, b] = s & 1023
                for f in range(bb.shape[0]):
                    if bb[f, b]: s += 1
                    bb[f, b] = (s & 1) == 1
    out[0] = s
@nb.njit
def aos(bi, bb, ptr, blocks, lo, hi, out):
    s = 0
    for i in range(lo, hi):
        for j in (i, i+1, i+20):
            if j >= hi: continue
            for e in range(ptr[j], ptr[j+1]):
                b = blocks[e]
                for f in range(bi.shape[1]):
                    s += bi[b, f]
                    bi[b, f] = s & 1023
                for f in range(bb.shape[1]):
                    if bb[b, f]: s += 1
                    bb[b, f] = (s & 1) == 1
    out[0] = s
out = np.zeros(1, np.int64)
junk = np.ones(64 << 17, np.int64)  # 64 MiB
@nb.njit
def flush(junk):
    s = 0
    for i in range(0, junk.shape[0], 8):
        s += junk[i]
    return s
for name, fn, bi, bb in (("soa", soa, np.zeros((9, n), np.int64), np.zeros((7, n), np.bool_)),
                         ("aos", aos, np.zeros((n, 9), np.int64), np.zeros((n, 7), np.bool_)),
                         ("aos32", aos, np.zeros((n, 9), np.int32), np.zeros((n, 7), np.bool_)),
                         ("soa32", soa, np.zeros((9, n), np.int32), np.zeros((7, n), np.bool_))):
    fn(bi, bb, ptr, blocks, lo, lo + 10, out)
    for r in range(3):
        t0 = time.perf_counter(); fn(bi, bb, ptr, blocks, lo, L, out); dt = time.perf_counter() - t0
        # cold: flush before each launch
        tc = 0.0
        for i in range(lo, lo + 300):
            flush(junk)
            t1 = time.perf_counter(); fn(bi, bb, ptr, blocks, i, i + 1, out); tc += time.perf_counter() - t1
        print(name, r, "warm us/launch %.2f" % (dt / (L - lo) * 1e6), "cold us/launch %.2f" % (tc / 300 * 1e6))
