"""A failure inside the runtime switches it off with one line, and training goes on correct.

GIVEN the unchanged GPT-2 example under ``UVMPREFETCH=1`` (dryrun, a budget below its working set: the C++
observer and the planner thread run) and a failure injected (``UVMPREFETCH_TEST_FAIL``) inside the observer's
callback or the planner thread; and a session whose backend hands every launch's moves to a real mover thread
(``MoveThread``) where a call fails,
WHEN training runs,
THEN the losses are bit-equal to a run without the runtime, stderr says once which part failed, and the report
says the run degraded, with that one error.
"""

import json
import time

import numpy as np
import pytest
import torch

from test_runtime_dryrun import _run  # the unchanged GPT-2 example in a subprocess, its losses as JSON
from uvmprefetch.config import RuntimeConfig
from uvmprefetch.runtime import native, native_observer
from uvmprefetch.runtime.session import Session


@pytest.fixture(scope="module", autouse=True)
def built():
    try:
        native_observer.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("plain"), "plain", {})[0]


@pytest.mark.parametrize("part", ["observer", "planner"])
def test_an_injected_failure_switches_the_runtime_off_and_training_goes_on(plain, tmp_path, part):
    report = tmp_path / "report.json"
    live, err = _run(tmp_path, part, {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun",
                                      "UVMPREFETCH_BUDGET": "24MiB", "UVMPREFETCH_REPORT": str(report),
                                      "UVMPREFETCH_LOG": "quiet", "UVMPREFETCH_TEST_FAIL": f"{part}:50"})
    assert live["losses_hex"] == plain["losses_hex"]  # bit for bit
    lines = [ln for ln in err.splitlines() if ln.startswith("uvmprefetch:")]
    assert len(lines) == 1 and f"uvmprefetch: {part} failed" in lines[0] and f"injected {part} failure" in lines[0]
    rep = json.loads(report.read_text())
    assert rep["observer"]["kind"] == "native" and rep["degraded"] is True
    assert len(rep["errors"]) == 1 and rep["errors"][0].startswith(f"{part}:")
    # the planner fails once it has planned 50 launches; the observer once it has recorded 50 (fewer are planned)
    assert rep["launches"] == 50 if part == "planner" else rep["launches"] <= 50


class MovingBackend:
    """A backend whose launches hand a (no-op) move per launch to a real ``MoveThread``, as the cuda backend does."""

    name = "moving"
    virtual_addresses = True
    device_type = "cpu"
    block_size = 64 * 1024
    capacity_bytes = 1 << 30
    gpu = None

    def __init__(self):
        from uvmprefetch.runtime.mover import MoveThread
        self.thread = MoveThread(0, max_pending=1 << 30)
        self.moved = 0

    def block_ids(self, start, length):
        return np.arange(start // self.block_size, (start + length - 1) // self.block_size + 1, dtype=np.int64)

    def free(self, blocks):
        pass

    def launch(self, info):
        self.thread.submit(self.block_size, self._move)

    def _move(self):
        time.sleep(0.02)  # slower than the planner: the failing call comes after the last submit (reported at stop)
        self.moved += 1

    def settle(self):
        self.thread.drain()  # as the cuda backend's: a call that failed after the last submit is reported at stop

    def end_iteration(self, k):
        pass

    def result(self):
        return {"moved": self.moved}

    def close(self):
        self.thread.close()


def train(steps=3):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = m(torch.randn(32, 64)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_failing_mover_call_switches_the_runtime_off_and_training_goes_on(monkeypatch, capsys):
    ref = train()
    monkeypatch.setenv("UVMPREFETCH_TEST_FAIL", "mover:5")
    be = MovingBackend()
    cfg = RuntimeConfig(enabled=True, backend="dryrun", policy="demand", log="quiet", observer="native")
    s = Session(cfg, backend=be, dormant=False).start()
    try:
        got = train()
    finally:
        rep = s.stop()
    assert got == ref
    assert s.degraded and rep["degraded"] and len(rep["errors"]) == 1 and rep["errors"][0].startswith("mover:")
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("uvmprefetch:")]
    assert len(err) == 1 and "mover failed" in err[0] and "injected mover failure" in err[0]
    assert be.moved == 5  # the five calls before the failing one were made; none after it


def test_a_lagging_planner_sheds_observation_and_training_goes_on_bit_equal(plain, tmp_path):
    # GIVEN a planner allowed to lag only 16 launches behind the training thread (a few microseconds per op here
    # against tens per planned launch: it falls behind at once), WHEN training runs, THEN the planner switches the
    # observer off while it catches up (the report counts the windows), no ring drops a record, nothing fails,
    # and the losses stay bit-equal.
    report = tmp_path / "report.json"
    live, err = _run(tmp_path, "shed", {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun",
                                        "UVMPREFETCH_BUDGET": "24MiB", "UVMPREFETCH_REPORT": str(report),
                                        "UVMPREFETCH_LOG": "quiet", "UVMPREFETCH_PLANNER_LAG": "16"})
    assert live["losses_hex"] == plain["losses_hex"]
    assert not [ln for ln in err.splitlines() if ln.startswith("uvmprefetch:")]
    rep = json.loads(report.read_text())
    ot = rep["observe_time"]
    assert not rep["degraded"] and rep["errors"] == [] and rep["launches"] > 0
    assert ot["planner"]["max_lag"] == 16 and ot["planner"]["shed_windows"] >= 1 and ot["planner"]["shed_s"] > 0
    assert ot["dropped_records"] == 0 and ot["allocator"]["dropped"] == 0
