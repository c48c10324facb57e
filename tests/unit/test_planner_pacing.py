"""The planner's pacing, piece by piece (``runtime/planner.py``): it rests after a burst only when the training
thread published records meanwhile, its tuning variables are checked, and records published out of order by
two threads are planned in sequence order, each op's run kept whole. (A whole run that sheds: test_runtime_failures.)"""

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.runtime import native_observer as no
from uvmprefetch.runtime.planner import Planner, _in_order, _knob


class SeqLib:
    """The one call ``Planner._rest`` makes: the process-wide record sequence."""

    def __init__(self):
        self.seq = 1

    def uvmobs_seq(self):
        return self.seq


def resting_planner(rest_s):
    p = object.__new__(Planner)
    p.lib = type("L", (), {})()
    p.lib.lib = SeqLib()
    p._seq_seen, p.rests, p.rest_s = 0, 0, rest_s
    return p


def test_the_planner_rests_only_when_the_training_thread_published_records():
    p = resting_planner(0.0)
    p._rest()
    assert p.rests == 1  # the sequence moved since the planner last looked: the training thread is issuing ops
    p._rest()
    assert p.rests == 1  # nothing new (it waits on the GPU, or in a long op): no rest, the planner goes on
    p.lib.lib.seq += 5
    p._rest()
    assert p.rests == 2


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
