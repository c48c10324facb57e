"""``deepum`` through its hooks: learns only from faults, chains the next kernels, pre-evicts, invalidates."""

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.gpus import get_profile
from uvmprefetch.policy import make_policy
from uvmprefetch.policy.base import LaunchInfo, PolicyContext
from uvmprefetch.policy.deepum import DeepUMPolicy

from _hooks import FakeView, drive

SEQ = [np.array([0, 1]), np.array([2, 3, 4]), np.array([5]), np.array([6, 7])]


def run(pol, view, iters, capture=None, forget=True):
    # DeepUM's setting: accesses are unknown; a launch's blocks are only what would fault.
    drive(pol, view, SEQ, iters, known_accesses=False, forget=forget,
          on_decision=None if capture is None else lambda it, k, dec: capture.__setitem__((it, k), dec))


def test_learns_from_faults_and_chains_the_next_kernels():
    pol = DeepUMPolicy(n_kernels=2)
    view = FakeView(16, 16)
    pol.on_start(PolicyContext(block_size=2 << 20, capacity_blocks=16, max_blocks=16, gpu=get_profile("h100-pcie-lit")))
    cap = {}
    run(pol, view, 3, cap)
    # Iteration 0 faults everything (nothing learned); the (3 predecessors -> next) context that wraps
    # around the iteration is complete in iteration 1, so from iteration 2 on the first launch prefetches
    # its own chain and the chains of the next 2 predicted kernels, in kernel order: 0,1 | 2,3,4 | 5.
    assert cap[(0, 0)] is None
    assert cap[(2, 0)].prefetch.tolist() == [0, 1, 2, 3, 4, 5]
    rep = pol.report()
    # only iteration 0 faults: later each launch brings its own chain
    assert rep["block_tables"] == 4 and rep["learned_faults"] == 8


def test_never_reads_info_blocks():
    # A LaunchInfo whose blocks lie (they name blocks never faulted) changes nothing.
    class Lying(LaunchInfo):
        pass

    pol_a, pol_b = DeepUMPolicy(n_kernels=2), DeepUMPolicy(n_kernels=2)
    for p in (pol_a, pol_b):
        p.on_start(PolicyContext(block_size=2 << 20, capacity_blocks=16, max_blocks=64, gpu=get_profile("h100-pcie-lit")))
    va, vb = FakeView(64, 16), FakeView(64, 16)
    run(pol_a, va, 2)
    orig = DeepUMPolicy.on_launch

    def lying(self, info, state):
        info.blocks = np.array([40, 41, 42])
        info.known_accesses = True
        return orig(self, info, state)

    pol_b.on_launch = lying.__get__(pol_b)
    run(pol_b, vb, 2)
    assert np.array_equal(va.resident, vb.resident)
    assert not vb.resident[40:43].any()


def test_pre_evicts_blocks_outside_the_next_kernels_dead_first():
    pol = DeepUMPolicy(n_kernels=1)
    view = FakeView(16, 5)
    pol.on_start(PolicyContext(block_size=2 << 20, capacity_blocks=5, max_blocks=16, gpu=get_profile("h100-pcie-lit")))
    run(pol, view, 2)
    view.resident[:] = False
    view.resident[[9, 10, 11, 12, 13]] = True  # full, nothing of kernels 0/1
    pol.on_free(np.array([12]))
    info = LaunchInfo(index=8, exec_id=1000, name=0, phase=1, iteration=2, duration=1e-3, known_accesses=False)
    dec = pol.on_launch(info, view)
    # needs 0,1 (kernel 0) + 2,3,4 (kernel 1): 5 victims, the freed one discarded
    assert dec.discard.tolist() == [12]
    assert sorted(dec.evict.tolist()) == [9, 10, 11, 13]
    assert dec.prefetch.tolist() == [0, 1, 2, 3, 4]


def test_exec_key_shape_merges_repeated_kernels():
    pol = DeepUMPolicy(exec_key="shape")
    assert pol.params.exec_key == "shape"
    with pytest.raises(ConfigError):
        make_policy("deepum:exec_key=pointer")
    with pytest.raises(ConfigError):
        make_policy("deepum:n_kernels=0")
