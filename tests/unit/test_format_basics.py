"""GIVEN a tiny hand-built trace WHEN written and read THEN it round-trips; the builder rejects double frees."""

import pytest

from uvmprefetch.errors import TraceError
from uvmprefetch.trace import READ, WRITE, TraceBuilder, load, save


def _tiny():
    b = TraceBuilder({"model": "tiny"})
    x = b.alloc(4 << 20, "activation")
    y = b.alloc(1 << 20, "param")
    b.launch("fill", [(x, 0, 4 << 20, WRITE)], duration=1e-3)
    b.launch("axpy", [(x, 0, 1 << 20, READ), (y, 0, 1 << 20, READ | WRITE)], duration=2e-3)
    b.free(x)
    return b


def test_round_trip(tmp_path):
    t = _tiny().build()
    save(t, tmp_path / "t.uvmt")
    u = load(tmp_path / "t.uvmt")
    assert u.equals(t) and u.meta == {"model": "tiny"}
    assert u.free_at.tolist() == [2, -1] and u.acc_ptr.tolist() == [0, 1, 3]


def test_double_free_rejected():
    b = _tiny()
    with pytest.raises(TraceError, match="freed twice"):
        b.free(0)
