"""Observation on the CPU, by both observers (the C++ one with its planner thread, and the Python dispatch mode):
forward, backward and optimizer launches are seen with their accesses, storage deaths reach ``on_free``, the
address layout reuses memory like a caching allocator, and a failing backend never breaks the user's program."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from uvmprefetch.config import RuntimeConfig
from uvmprefetch.runtime.observe import VirtualLayout, accesses_of, tensor_extent
from uvmprefetch.runtime.session import Session
from uvmprefetch.trace.format import PHASE, READ, WRITE

BS = 64 * 1024


class RecordingBackend:
    """A backend that records what the session hands it (the boundary between observe and act)."""

    name = "record"
    virtual_addresses = True
    device_type = "cpu"
    block_size = BS
    capacity_bytes = 1 << 30
    gpu = None

    def __init__(self, fail_at=None):
        self.launches, self.frees, self.iters = [], [], []
        self.fail_at = fail_at

    def block_ids(self, start, length):
        return np.arange(start // BS, (start + length - 1) // BS + 1, dtype=np.int64)

    def free(self, blocks):
        self.frees.append((len(self.launches), blocks.copy()))

    def launch(self, info):
        if self.fail_at is not None and info.index >= self.fail_at:
            raise RuntimeError("injected CUDA failure")
        self.launches.append(info)

    def end_iteration(self, k):
        self.iters.append(k)

    def result(self):
        return {}

    def close(self):
        pass


OBSERVERS = ["python", "native"]


@pytest.fixture(params=OBSERVERS)
def observer(request):
    if request.param == "native":
        from uvmprefetch.runtime import native, native_observer
        try:
            native_observer.load()
        except native.NativeBuildError as e:
            pytest.skip(f"the C++ observer cannot be built here: {e}")
    return request.param


def session(backend, observer="python", **kw):
    cfg = RuntimeConfig(enabled=True, backend="dryrun", policy="demand", log="quiet", observer=observer, **kw)
    return Session(cfg, backend=backend, dormant=False)


def train(steps=2, seed=0, update="adam", clip=False):
    """A small training loop: ``update`` "adam" (torch.optim, hooked) or "manual" (plain tensor ops under
    no_grad: no optimizer hook fires); ``clip``: gradient clipping between the backward pass and the step."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2) if update == "adam" else None
    losses = []
    for _ in range(steps):
        loss = m(torch.randn(32, 64)).square().mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        if opt is not None:
            opt.step()
            opt.zero_grad()
        else:
            with torch.no_grad():
                for q in m.parameters():
                    q.sub_(1e-2 * q.grad)
                    q.grad = None
        losses.append(loss.item())
    return losses


def observed(observer, **kw):
    """``train(**kw)`` under a session on a ``RecordingBackend``: (backend, session)."""
    be = RecordingBackend()
    s = session(be, observer).start()
    try:
        train(**kw)
    finally:
        s.stop()
    return be, s


def test_forward_backward_optimizer_and_iterations_seen(observer):
    be, s = observed(observer, steps=2)
    phases = {PHASE[p] for p in ("forward", "backward", "optimizer")}
    assert phases <= {i.phase for i in be.launches}
    assert be.iters == [0, 1] and s.iteration == 2
    assert [i.index for i in be.launches] == list(range(len(be.launches)))
    mm = [i for i in be.launches if s_name(s, i).startswith("aten::addmm")]
    assert mm and all(i.blocks.size and i.write_blocks.size for i in mm)
    assert all(np.all(np.isin(i.write_blocks, i.blocks)) for i in be.launches)
    # the same op on the same shapes gets the same execution id in both iterations
    ids = [(i.exec_id, i.iteration) for i in be.launches if i.phase == PHASE["forward"]]
    it0 = [e for e, k in ids if k == 0]
    it1 = [e for e, k in ids if k == 1]
    assert it0[-len(it1):] == it1  # iteration 0 also holds the model's initialisation
    assert not any(s_name(s, i).startswith('aten::empty') for i in be.launches)  # no kernel, no launch



def test_iterations_inferred_without_a_torch_optim_step(observer):
    # No optimizer hook fires: the launch after each backward pass starts an iteration, so the policy's
    # per-iteration state still resets.
    be, s = observed(observer, steps=4, update="manual")
    assert be.iters == [0, 1, 2, 3] and s.iteration == 4 and s.iter_ends.inferred == 4
    seg = {k: [(i.exec_id, i.phase) for i in be.launches if i.iteration == k] for k in range(5)}
    assert seg[1] == seg[2] == seg[3] and seg[1]  # update, forward, backward: the same launches every iteration
    assert seg[1][0][1] == PHASE["forward"] and seg[1][-1][1] == PHASE["backward"]
    assert seg[0] and seg[0][-1][1] == PHASE["backward"] and seg[4] and all(p == PHASE["forward"] for _, p in seg[4])


def test_a_hooked_step_after_gradient_clipping_ends_each_iteration_once(observer):
    # Clipping runs forward-phase ops between the backward pass and the step: they end the first iteration
    # (no hook has been seen yet), so that step's hook ends none; after it only the hooks end iterations. Three
    # loops, three ends.
    be, s = observed(observer, steps=3, clip=True)
    assert be.iters == [0, 1, 2] and s.iter_ends.inferred == 1 and s.iteration == 3


def s_name(s, info):
    return {v: k for k, v in s.names.items()}[info.name]


def test_tensor_death_reaches_on_free(observer):
    be = RecordingBackend()
    s = session(be, observer).start()
    try:
        x = torch.ones(4 * BS // 4)  # 4 blocks
        y = x * 2
        s.flush()
        blocks_y = be.launches[-1].write_blocks.copy()
        del y
        z = x + 1  # the next launch drains the death first
        s.flush()
        assert be.frees, "no free reported"
        _, freed = be.frees[-1]
        assert set(blocks_y.tolist()) <= set(freed.tolist())
        del z
    finally:
        s.stop()


def test_accesses_modes():
    a, b = torch.ones(8), torch.ones(8)
    out = a.add_(b)
    acc = accesses_of(torch.ops.aten.add_.Tensor, (a, b), {}, out, "cpu")
    modes = [m for t, m in acc]
    assert modes[0] == READ | WRITE and modes[1] == READ and modes[-1] == WRITE
    v = torch.arange(20.)[2:12:2]
    assert tensor_extent(v) == (8, (1 + 4 * 2) * 4)


def test_failing_backend_degrades_training_goes_on(capsys, observer):
    ref = train(steps=3)
    be = RecordingBackend(fail_at=5)
    s = session(be, observer).start()
    try:
        got = train(steps=3)
    finally:
        rep = s.stop()
    assert got == ref  # same results: the runtime never touches the user's data
    assert s.degraded and rep["degraded"] and len(rep["errors"]) == 1
    err = capsys.readouterr().err
    assert err.count("injected CUDA failure") == 1  # logged once
    assert len(be.launches) == 5  # nothing after the failure


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), min_size=1, max_size=80))
def test_virtual_layout_no_overlap_and_reuse(ops):
    lay, live = VirtualLayout(), []
    for is_alloc, size in ops:
        if is_alloc or not live:
            start = lay.alloc(size)
            live.append((start, -(-size // 512) * 512))
        else:
            start, sz = live.pop(size % len(live))
            lay.free(start, sz)
        spans = sorted(live)
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))  # no overlap
        assert all(a + n <= lay.top for a, n in spans)
    for start, sz in live:
        lay.free(start, sz)
    assert lay.top == 0  # everything coalesced back


@pytest.mark.parametrize("policy", ["demand"])
def test_dryrun_backend_respects_budget(policy):
    from uvmprefetch.runtime.dryrun import DryrunBackend
    from uvmprefetch.config import parse_budget
    cfg = RuntimeConfig(enabled=True, backend="dryrun", policy=policy, log="quiet", budget=parse_budget("8MiB"))
    s = Session(cfg, dormant=False)  # (a program this short would end before a dormant planner woke)
    assert isinstance(s.backend, DryrunBackend)
    s.start()
    try:
        xs = [torch.full((1 << 18,), float(i)) for i in range(12)]  # 12 MiB live > 8 MiB budget
        total = sum(x.sum() for x in xs)
    finally:
        rep = s.stop()
    assert float(total) == sum(i * (1 << 18) for i in range(12))
    assert rep["working_set_bytes"] > 8 << 20 >= rep["peak_resident_bytes"]
    assert rep["bytes_dtoh"] > 0 and not rep["degraded"]



def test_inferred_iteration_ends_reach_the_policy_through_the_dryrun_backend(observer):
    # A hand-written update under the real dryrun backend and the default policy: every inferred end reaches
    # uvmprefetch's on_iteration (its per-iteration counts reset), the report counts them, and training is as
    # without the runtime.
    from uvmprefetch.config import parse_budget
    ref = train(steps=4, update="manual")
    cfg = RuntimeConfig(enabled=True, backend="dryrun", policy="uvmprefetch", log="quiet",
                        budget=parse_budget("256KiB"), observer=observer)
    s = Session(cfg, dormant=False).start()
    try:
        got = train(steps=4, update="manual")
    finally:
        rep = s.stop()
    assert got == ref and not rep["degraded"] and rep["errors"] == []
    assert rep["iterations"] == rep["inferred_iterations"] == 4
    assert s.policy.history.r["iters"] == 4 and s.policy.history.r["n_starts"] == 4
    assert rep["model_iter_s"] and len(rep["model_iter_s"]) == 4

def test_forked_child_does_not_observe_or_report(tmp_path, observer):
    import os
    be = RecordingBackend()
    s = session(be, observer).start()
    try:
        torch.ones(8) + 1
        s.flush()
        n = len(be.launches)
        pid = os.fork()
        if pid == 0:  # child: ops run unobserved, nothing is reported at exit
            torch.ones(8) * 3
            os._exit(0 if (not s.active and len(be.launches) == n) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert s.active
    finally:
        s.stop()


def test_planner_keeps_a_run_cut_by_the_drain_for_the_next_batch():
    # The ring publishes an op's records one by one: a drain can stop inside a run whose producer is still
    # writing. The planner must plan it whole, with the next batch, and never read past the batch.
    from uvmprefetch.runtime import native_observer as no
    from uvmprefetch.runtime.planner import Planner
    recs = np.zeros(9, dtype=no.OP_DTYPE)
    recs["c"][0], recs["d"][0] = np.uint64(no.HEAD) << np.uint64(56), 2  # op 1: head, head2, two ranges
    recs["c"][1] = np.uint64(no.HEAD2) << np.uint64(56)
    recs["c"][2:4] = np.uint64(no.RANGE) << np.uint64(56)
    recs["c"][4], recs["d"][4] = np.uint64(no.HEAD) << np.uint64(56), 3  # op 2: head, head2, three ranges
    recs["c"][5] = np.uint64(no.HEAD2) << np.uint64(56)
    recs["c"][6:9] = np.uint64(no.RANGE) << np.uint64(56)
    p = object.__new__(Planner)
    p._op_carry = recs[:0]
    first = p._whole_runs(recs[:7])  # the drain stopped after op 2's first range
    assert len(first) == 4 and len(p._op_carry) == 3
    second = p._whole_runs(recs[7:])
    assert len(second) == 5 and second["d"][0] == 3 and len(p._op_carry) == 0


def test_a_session_never_plans_what_an_earlier_one_left_in_the_rings():
    # The rings are process-wide; records pushed for another run (here: a bare start of the observer with nobody
    # draining) must not reach a new session's policy.
    from uvmprefetch.runtime import native, native_observer
    try:
        lib = native_observer.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")
    clean, _ = observed("native", steps=1)
    lib.start("cpu", True)
    torch.ones(8).mul_(3)
    lib.stop()  # two op runs left in the ring
    be, s = observed("native", steps=1)
    assert len(be.launches) == len(clean.launches) and be.iters == clean.iters == [0]
    assert s_name(s, be.launches[0]) != "aten::ones"
