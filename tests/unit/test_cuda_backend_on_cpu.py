"""The cuda backend's live path on a CPU, against a fake at the true boundary (``fake_cuda.py``).

GIVEN a real PyTorch training loop on the CPU, the real C++ observer, planner thread, mover thread, policy, books
and ``CudaBackend``, with only the CUDA calls, streams, events and the shim's view faked (``runtime.mover.CudaApi``),
and a budget below the working set,
WHEN training runs,
THEN the policy's decisions reach the fake as prefetches and evictions, every one issued on the mover thread; no
block is evicted while the launch being planned uses it, and the blocks the calls leave on the GPU stay within the
budget after every launch; each move is entered in the pre-op gate's table with its event, stays there in flight
while the (lagging) fake GPU has not passed that event, and then settles where the move took it; and a CUDA call
that fails switches the runtime off with one line while training goes on bit-equal.
"""

import shutil

import numpy as np
import pytest
import torch

import fake_cuda
from uvmprefetch.config import RuntimeConfig, parse_budget
from uvmprefetch.runtime import native, native_observer

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
BS = 2 << 20
BUDGET = 16 << 20
LAG = 4  # events the fake GPU is behind (FakeTorchCuda.lag)


@pytest.fixture(scope="module")
def libcudart(tmp_path_factory):
    try:
        native_observer.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")
    return fake_cuda.build_libcudart(tmp_path_factory.mktemp("fakecudart"))


def train(steps=4, layers=48, width=256):
    """A chain of linear layers (256 KiB of weights each), forward, backward, AdamW: the losses, bit for bit."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())
                              for _ in range(layers)])
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    x = torch.randn(16, width)
    losses = []
    for _ in range(steps):
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    return losses


def cfg():
    return RuntimeConfig(enabled=True, backend="cuda", budget=parse_budget(f"{BUDGET}"), log="quiet",
                         observer="native")


def trained(libcudart, mark=False, **kw):
    """``train()`` under the runtime with the cuda backend over the fakes (``fake_cuda.start(**kw)``; ``mark``: the
    launches' markers in the call log): (losses, session, FakeRuntime, report)."""
    s, rt = fake_cuda.start(cfg(), libcudart, **kw)
    if mark:
        marking(s, rt)
    try:
        losses = train()
    finally:
        rep = s.stop()
    return losses, s, rt, rep


def marking(s, rt):
    """Each launch puts a marker with its block numbers into the mover's queue before its moves: the fake's call
    log then reads launch by launch in the order the backend issued the calls."""
    be = s.backend
    launch = be.launch

    def marked(info):
        be.mover.thread.submit(0, rt.mark, info.index, set((be._addr[info.blocks] // BS).tolist()))
        launch(info)
    be.launch = marked


def test_decisions_reach_the_fake_from_the_mover_thread_in_a_legal_order(libcudart):
    _, s, rt, rep = trained(libcudart, mark=True, lag=LAG)
    be = s.backend
    assert not rep["degraded"] and rep["errors"] == [] and rep["observer"]["kind"] == "native"
    assert rep["launches"] > 1000 and rep["working_set_bytes"] > 2 * BUDGET
    moves = rt.moves()
    to_gpu = [c for c in moves if c[3] == "gpu"]
    to_host = [c for c in moves if c[3] == "host"]
    assert len(to_gpu) > 100 and len(to_host) > 100
    assert {c[5] for c in moves} == {"uvmprefetch-mover"}  # never the training thread, never the planner
    br = rep["backend_result"]
    assert br["mover"] == "thread" and br["mover_calls_on_training_thread"] == {"to_gpu": 0, "to_host": 0}
    # the CpuShim's managed allocations are one per block: each call moves exactly one numbered block
    assert all(c[1] % BS == 0 and c[2] == BS and c[1] // BS in be._ids for c in moves)
    cap = BUDGET // BS
    running, resident, launches = set(), set(), 0
    for c in rt.calls + [("mark", None, set())]:
        if c[0] == "mark":  # the previous launch ran: what it touched is on the GPU (faulted in if not prefetched)
            resident |= running
            assert len(resident) <= cap, f"after launch {c[1]}: {len(resident)} blocks on the GPU, budget {cap}"
            running = c[2]
            launches += 1
            continue
        if c[0] != "prefetch":
            continue
        b = c[1] // BS
        if c[3] == "host":
            assert b not in running, f"block {b} evicted while the launch being planned uses it"
            resident.discard(b)
        else:
            resident.add(b)
    assert launches == rep["launches"] + 1
    # the pre-op gate: every move was entered with its event; settled, each block is where its last move took it
    # the pre-op gate: every move was entered with its event; the fake GPU lags LAG events behind, so the last moves
    # are still in flight at the end (their blocks "to the GPU" / "to the host" with that move's event); once it
    # has caught up, each block settles where its last move took it
    gate = be.mover.gate
    assert 0 < gate.moves <= len(moves)  # one entry per batch of ranges the mover issued
    last = {}
    for c in moves:
        last[c[1] // BS] = c[3]
    blocks = np.asarray(sorted(last), dtype=np.uint64)
    u64 = native_observer._u64p

    def table():
        out = np.zeros(blocks.size, dtype=np.uint64)
        gate.lib.uvmgate_get(blocks.ctypes.data_as(u64), blocks.size, out.ctypes.data_as(u64))
        return dict(zip(blocks.tolist(), out.tolist()))
    gate.settle()
    pending = list(gate._pending)
    assert 0 < len(pending) <= LAG
    assert all(handle == ev.cuda_event and not ev.query() for ev, handle, _, _ in pending)
    now = table()
    in_flight = {b: v for b, v in now.items() if v & ~7}  # entries that still carry an event
    assert {v & ~7 for v in in_flight.values()} <= {h & ~7 for _, h, _, _ in pending}
    assert {v & 7 for v in in_flight.values()} <= {gate.TO_GPU, gate.TO_HOST}
    _, h, arr, _ = pending[-1]  # the newest move: nothing replaced its entries
    assert all(now[b] == (h & ~7) | (gate.TO_GPU if last[b] == "gpu" else gate.TO_HOST) for b in arr.tolist())
    be.api.torch.cuda.recorded += LAG  # the fake GPU catches up
    gate.settle()
    assert gate.in_flight() == 0
    assert table() == {b: gate.RESIDENT if w == "gpu" else gate.ON_HOST for b, w in last.items()}


def test_a_failing_cuda_call_switches_the_runtime_off_and_training_goes_on_bit_equal(libcudart, capfd):
    got, s, rt, rep = trained(libcudart, fail={"prefetch": 40})
    assert got == train()  # bit for bit, against the same loop without the runtime
    assert s.degraded and rep["degraded"] and rep["errors"] == [rep["errors"][0]]
    assert rep["errors"][0].startswith("mover:") and "cudaErrorLaunchFailure" in rep["errors"][0]
    err = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("uvmprefetch:")]
    assert len(err) == 1 and "mover failed" in err[0], err
    assert rt.counts["prefetch"] == 40 and len(rt.moves()) == 39  # nothing issued after the failing call


def test_where_auto_falls_back_to_the_python_observer_the_policy_is_told_the_moves_are_synchronous(libcudart,
                                                                                                 monkeypatch):
    # GIVEN the runtime's defaults without discards (UVM's eviction, the mover chosen by the observer) under
    # UVMPREFETCH_OBSERVER=auto, once where the C++ observer runs and once where it cannot be loaded
    def policy_after_start(broken: bool):
        c = RuntimeConfig(enabled=True, backend="cuda", budget=parse_budget(f"{BUDGET}"), log="quiet",
                          observer="auto")
        if broken:
            def unavailable(**kw):
                raise native.NativeBuildError("no compiler (test)")
            monkeypatch.setattr(native_observer, "load", unavailable)
        s, _ = fake_cuda.start(c, libcudart)
        try:
            return s.observer, s.backend.policy_ctx.sync_moves, bool(s.backend.policy.plan.r["driver_victims"])
        finally:
            s.stop()

    # WHEN each session starts
    # THEN under the C++ observer the mover thread issues the moves and the driver may choose victims; in the
    # Python fallback (no mover thread) the policy starts again told the planning thread issues them, as under
    # UVMPREFETCH_OBSERVER=python
    assert policy_after_start(False) == ("native", False, True)
    assert policy_after_start(True) == ("python", True, False)
