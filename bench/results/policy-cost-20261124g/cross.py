"""What a call into ``_uvmkernels.step`` costs through Numba's dispatcher and through the compiled entry point the
dispatcher would pick (``UvmPrefetchPolicy._step_entry``), warm and with 64 MiB of other memory read before each
call ("cold", as ``bench/policy_cost.py --disturb 64``). The step returns at once here (no launch pending): the
crossing alone. Also no-op kernels of 14 and 3 arguments, and one of 4 whose 12 scalars go through an array.
Run from the repository root: ``python bench/results/policy-cost-20261124g/cross.py`` (output: cross.txt).
"""
import time

import numba as nb
import numpy as np

from uvmprefetch.gpus import PROFILES
from uvmprefetch.policy import _uvmkernels as _k
from uvmprefetch.policy import make_policy
from uvmprefetch.policy.base import PolicyContext

pol = make_policy("uvmprefetch")
pol.on_start(PolicyContext(block_size=2 << 20, capacity_blocks=1000, max_blocks=20000, gpu=PROFILES["h100-pcie"],
                           live=False))
arr = pol._step_arrays()
blocks = np.arange(100, dtype=np.int64)
writes = blocks[:50]
resident = np.zeros(20000, bool)
in_flight = np.zeros(20000, bool)
pol._reg[_k.G_PEND] = 0  # no launch pending: the step returns at once
inp = np.zeros(12, np.float64)
ARGS = (1, 2, blocks, writes, 3, 1e-5, resident, in_flight, 20000, 1000, 10, 0.5, 100, arr)


@nb.njit(cache=False, nogil=True)
def four(a, b, c, s):
    return 0


@nb.njit(cache=False, nogil=True)
def three(a, b, s):
    return 0


@nb.njit(cache=False, nogil=True)
def fourteen(k, n, a, b, i, d, r, f, ni, c, u, no, w, s):
    return 0


def step():
    _k.step(1, 2, blocks, writes, 3, 1e-5, resident, in_flight, 20000, 1000, 10, 0.5, 100, arr)


step()
four(blocks, writes, inp, arr)
three(blocks, writes, arr)
fourteen(*ARGS)
ep_step = _k.step.overloads[_k.step.signatures[0]].entry_point
ep_four = four.overloads[four.signatures[0]].entry_point
ep_14 = fourteen.overloads[fourteen.signatures[0]].entry_point


def four_fill():
    inp[:] = (1, 2, 3, 1e-5, 20000, 1000, 10, 0.5, 100, 0, 0, 0)
    four(blocks, writes, inp, arr)


def four_fill_ep():
    inp[:] = (1, 2, 3, 1e-5, 20000, 1000, 10, 0.5, 100, 0, 0, 0)
    ep_four(blocks, writes, inp, arr)


cases = [("step 14 args (returns at once)", step),
         ("step via entry_point", lambda: ep_step(1, 2, blocks, writes, 3, 1e-5, resident, in_flight, 20000, 1000, 10,
                                                  0.5, 100, arr)),
         ("no-op 14 args", lambda: fourteen(1, 2, blocks, writes, 3, 1e-5, resident, in_flight, 20000, 1000, 10, 0.5,
                                            100, arr)),
         ("no-op 14 args entry_point", lambda: ep_14(1, 2, blocks, writes, 3, 1e-5, resident, in_flight, 20000, 1000,
                                                     10, 0.5, 100, arr)),
         ("no-op 3 args", lambda: three(blocks, writes, arr)),
         ("fill 12 scalars + no-op 4 args", four_fill),
         ("fill 12 scalars + no-op 4 args entry_point", four_fill_ep)]
flush = np.ones((64 << 20) // 8)
for rep in range(2):
    for name, fn in cases:
        for cold in (False, True):
            ts = []
            for _ in range(2000):
                if cold:
                    flush.sum()
                t = time.perf_counter_ns()
                fn()
                ts.append(time.perf_counter_ns() - t)
            print(f"{name:45s} {'cold' if cold else 'warm'}: median {np.median(ts) / 1e3:6.2f} us", flush=True)
