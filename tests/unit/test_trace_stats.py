"""GIVEN hand-built traces WHEN summarised THEN footprints, live bytes, layout reuse and working set are exact."""

from uvmprefetch.trace import READ, WRITE, TraceBuilder
from uvmprefetch.trace.stats import first_fit_layout, live_bytes, summarize, touched_bytes


def _trace():
    b = TraceBuilder({"gpu": "h100-pcie"})
    p = b.alloc(4096, "param")
    a = b.alloc(8192, "activation")
    b.launch("fwd", [(p, 0, 4096, READ), (a, 0, 8192, WRITE)], duration=1e-5, flops=1e6)
    b.free(a)
    b.iteration = 0
    c = b.alloc(8192, "activation")  # reuses a's addresses
    b.launch("fwd", [(p, 0, 4096, READ), (c, 1024, 2048, WRITE), (c, 2048, 2048, READ)], duration=1e-5, flops=1e6)
    b.free(c)
    return b.build()


def test_live_bytes_and_layout_reuse():
    t = _trace()
    assert live_bytes(t).tolist() == [4096 + 8192, 4096 + 8192, 4096]
    base = first_fit_layout(t)
    assert base.tolist() == [0, 4096, 4096]


def test_working_set_counts_overlaps_once():
    t = _trace()
    # iteration 0 = launch 1: p (4096) + c's [1024, 4096) (3072)
    assert touched_bytes(t, 0) == 4096 + 3072
    s = summarize(t)
    assert s["working_set_bytes"] == 4096 + 3072 and s["iterations"] == 1
    assert s["peak_live_bytes"] == 4096 + 8192 and s["param_bytes"] == 4096 and s["activation_peak_bytes"] == 8192
    assert s["ideal_s"]["h100-pcie"] == t.launch_dur[1]
