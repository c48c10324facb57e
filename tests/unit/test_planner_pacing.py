"""The planner's pacing, piece by piece (``runtime/planner.py``): it asks for a turn only with something to plan,
rests after a burst only when the training thread waited for it, its tuning variables are checked, and records published out of order by
two threads are planned in sequence order, each op's run kept whole. (A whole run that sheds: test_runtime_failures.)"""

import numpy as np
import pytest

from test_native_observer import lib  # noqa: F401 - the fixture: the observer library, or a skip
from uvmprefetch.errors import ConfigError
from uvmprefetch.runtime import native_observer as no
from uvmprefetch.runtime.planner import Planner, _in_order, _knob


class SeqLib:
    """The call ``Planner._queued`` makes: the process-wide record sequence."""

    def __init__(self):
        self.seq = 1

    def uvmobs_seq(self):
        return self.seq


def resting_planner(share):
    p = object.__new__(Planner)
    p.lib = type("L", (), {})()
    p.lib.held = SeqLib()
    p._seq_seen, p.rests, p.rest_factor, p.slice_s = 0, 0, (1 - share) / share, 0.001
    p._segs, p._events, p._op_carry = [], np.zeros(0), np.zeros(0)
    return p


def test_the_planner_asks_for_a_turn_only_when_there_is_something_to_plan():
    p = resting_planner(0.5)
    assert p._queued()  # the sequence moved since the planner last looked: records to drain
    assert not p._queued()  # nothing new, nothing pending: no turn (the training thread is not parked for nothing)
    p.lib.held.seq += 3
    assert p._queued()


def test_the_planner_rests_after_a_burst_only_if_the_training_thread_waited_for_it(monkeypatch):
    slept = []
    monkeypatch.setattr("uvmprefetch.runtime.planner.time.sleep", slept.append)
    p = resting_planner(0.25)
    p._rest(0.001, False)
    assert p.rests == 0 and slept == []  # never parked (it waits for the GPU, or in long ops): plan on
    p._rest(0.001, True)
    assert p.rests == 1 and slept == [pytest.approx(0.003)]  # parked: rest 3x the burst, so its wait stays <= 1/4
    p._rest(0.5, True)
    assert slept[-1] == pytest.approx(0.012)  # a long first burst (kernels loading) rests at most 4 slices' worth


@pytest.mark.parametrize("value", ["abc", "0", "2", "-1"])
def test_a_bad_share_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("UVMPREFETCH_PLANNER_SHARE", value)
    with pytest.raises(ConfigError, match="UVMPREFETCH_PLANNER_SHARE"):
        _knob("UVMPREFETCH_PLANNER_SHARE", 0.1, 0.01, 1.0)


def test_an_unset_knob_is_its_default_and_a_set_one_its_value(monkeypatch):
    monkeypatch.delenv("UVMPREFETCH_PLANNER_LAG", raising=False)
    assert _knob("UVMPREFETCH_PLANNER_LAG", 4096, 0, 1 << 30) == 4096
    monkeypatch.setenv("UVMPREFETCH_PLANNER_LAG", "16")
    assert _knob("UVMPREFETCH_PLANNER_LAG", 4096, 0, 1 << 30) == 16


def run(seq, nranges, tag):
    """One op's records: head (seq), head2, ``nranges`` ranges whose ``b`` is ``tag`` (to follow them)."""
    r = np.zeros(2 + nranges, dtype=no.OP_DTYPE)
    r["a"][0], r["c"][0], r["d"][0] = seq, np.uint64(no.HEAD) << np.uint64(56), nranges
    r["c"][1] = np.uint64(no.HEAD2) << np.uint64(56)
    r["c"][2:] = np.uint64(no.RANGE) << np.uint64(56)
    r["b"][2:] = tag
    return r


def mark(seq):
    r = np.zeros(1, dtype=no.OP_DTYPE)
    r["a"][0], r["c"][0] = seq, np.uint64(no.MARK) << np.uint64(56) | np.uint64(no.MARK_OPT_POST)
    return r


def test_runs_published_out_of_order_are_planned_in_sequence_order_whole():
    ops = np.concatenate([run(5, 2, 50), run(3, 1, 30), mark(4), run(7, 3, 70), run(6, 0, 60)])
    out = _in_order(ops)
    kind = out["c"] >> np.uint64(56)
    heads = np.flatnonzero((kind == no.HEAD) | (kind == no.MARK))
    assert out["a"][heads].tolist() == [3, 4, 5, 6, 7]
    assert len(out) == len(ops)
    # each run's ranges follow their own head
    assert out["b"][kind == no.RANGE].tolist() == [30, 50, 50, 70, 70, 70]
    in_order = np.concatenate([run(1, 1, 10), run(2, 1, 20)])
    assert _in_order(in_order) is in_order  # already in order: no copy


@pytest.mark.parametrize("light", [False, True])
def test_a_turn_parks_the_training_thread_at_its_next_op_and_only_it_for_at_most_20_ms(lib, light):
    # GIVEN the observer started on this thread (the training thread), with full records or, while shedding, the
    # callback without inputs; WHEN another thread takes ten turns of 40 ms each (bursts that run long) while a
    # second thread runs ops too, THEN this thread waited at an op in some turns, never more than once per turn
    # and never for more than the turn's 20 ms (plus a late wake-up on a loaded machine); the second thread never
    # waited; nobody is parked any more when a turn comes back.
    import threading
    import time

    import torch
    dropped = lib.counters()["dropped"]
    lib.start("cpu", active=not light)
    if light:
        assert lib.lib.uvmobs_set_light(1) == 0
    try:
        x, y = torch.ones(64), torch.ones(64)
        other = {"ops": 0}
        stop = threading.Event()

        def other_thread():
            while not stop.is_set():
                y.add_(1)
                other["ops"] += 1

        def drainer():  # the rings are process-wide: a full one would count drops other tests then see
            while not stop.is_set():
                lib.drain_ops()
                time.sleep(0.002)
        th, dr = threading.Thread(target=other_thread), threading.Thread(target=drainer)
        th.start()
        dr.start()
        p0 = lib.parked()
        parked_at_return, longest = [], []

        def planner():
            for _ in range(10):
                time.sleep(0.01)
                before = lib.parked()[1]
                lib.lib.uvmobs_turn(1)
                time.sleep(0.15)  # a turn held far past the 20 ms a park may last: an uncapped park would show it
                parked_at_return.append(lib.held.uvmobs_turn(0))
                longest.append((lib.parked()[1] - before) / 1e9)
        pl = threading.Thread(target=planner)
        pl.start()
        t0 = time.perf_counter()
        while pl.is_alive() and time.perf_counter() - t0 < 30:
            x.add_(1)
        pl.join()
        stop.set()
        th.join()
        dr.join()
        parks = lib.parked()[0] - p0[0]
        assert 1 <= parks <= 10 and max(longest) <= 0.1  # an uncapped park would last the 150 ms
        assert parked_at_return == [0] * 10 and other["ops"] > 0
        assert lib.counters()["dropped"] == dropped
    finally:
        lib.lib.uvmobs_set_light(0)
        lib.stop()
        lib.drain_ops()


def _turns_parked(lib, light: bool, turns: int, take) -> list[int]:
    """One observer run on this thread (the training thread): a planner thread takes ``turns`` turns with
    ``take``, each followed by a 2 ms burst of Python that holds the GIL (the planner's planning), while this
    thread runs small ops from Python. Returns, per turn, how many threads were parked when the burst began."""
    import threading
    import time

    import torch
    lib.start("cpu", active=not light)
    if light:
        assert lib.set_active(False) == no.STATE_DORMANT and lib.lib.uvmobs_set_light(1) == 0
    try:
        x = torch.ones(64)
        parked, done = [], threading.Event()

        def planner():
            for _ in range(turns):
                parked.append(take())
                end = time.perf_counter() + 0.002
                while time.perf_counter() < end:  # Python, GIL held: what the planner's _batch is
                    pass
                lib.held.uvmobs_turn(0)
                time.sleep(0.002)
            done.set()
        pl = threading.Thread(target=planner)
        pl.start()
        t0 = time.perf_counter()
        while not done.is_set() and time.perf_counter() - t0 < 30:
            x.add_(1)
            lib.drain_ops()
        pl.join()
        return parked
    finally:
        lib.lib.uvmobs_set_light(0)
        lib.stop()
        lib.drain_ops()


@pytest.mark.parametrize("light", [False, True])
def test_every_turn_parks_the_training_thread_also_after_a_stop_and_start(lib, light):
    # GIVEN a training thread running small ops from Python, observed with full records or, while shedding, with
    # the callback without inputs; WHEN a planner thread takes turns, each followed by a burst of Python holding
    # the GIL, in two runs of the observer in one process (stopped and started again between them, as the rounds
    # of bench/runtime_overhead.py --inprocess); THEN in every turn of both runs the training thread is parked in
    # a callback when the burst begins (it waits for the planner there, counted, not in the GIL), and the parks
    # counted grow by one per turn.
    def take():
        return lib.lib.uvmobs_turn_wait(1_000_000)  # returns at the park (1 s: a loaded machine)
    for run in range(2):
        p0 = lib.parked()[0]
        parked = _turns_parked(lib, light, 15, take)
        assert lib.parked()[0] - p0 == 15, run
        assert parked == [1] * 15, (run, parked)


def test_the_overhead_benchmark_splits_the_planners_time_by_part(lib, tmp_path):
    # bench/runtime_overhead.py --split: the loop recorded, then planned on one thread, timed by part
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "split.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    r = subprocess.run([sys.executable, str(root / "bench" / "runtime_overhead.py"), "--split", "--iters", "2",
                        "--warmup", "1", "--layers", "24", "--out", str(out)], env={**env, "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["launches"] > 100 and res["iterations"] >= 1
    parts = res["policy_us"] + res["simulator_us"] + res["bookkeeping_us"]  # (this thread's CPU time)
    assert parts == pytest.approx(res["planner_cpu_us_per_launch"], rel=1e-6)
    assert res["policy_us"] > 0 and res["simulator_us"] > 0 and res["bookkeeping_us"] > 0
    # the same records planned by the real cuda backend over the fake CUDA boundary (tests/unit/fake_cuda.py)
    cu = res["cuda"]
    assert cu["launches"] == res["launches"]
    parts = cu["policy_us"] + cu["books_us"] + cu["mover_us"] + cu["fake_us"] + cu["bookkeeping_us"]
    assert parts == pytest.approx(cu["planner_cpu_us_per_launch"], rel=1e-6)
    assert cu["policy_us"] > 0 and cu["books_us"] > 0 and cu["mover_thread_cpu_us"] >= 0
    assert "simulator" in r.stdout.splitlines()[-3] and r.stdout.splitlines()[-1].startswith("cuda")  # table last
