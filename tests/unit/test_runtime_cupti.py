"""The optional CUPTI observer: clean import guard, and record counting against a fake ``cupti`` module
(the boundary: cupti-python's activity API as its samples use it)."""

import types

import pytest

from uvmprefetch.runtime import cupti as C


def fake_cupti(fail_enable=False):
    kinds = types.SimpleNamespace(CONCURRENT_KERNEL=10, UNIFIED_MEMORY_COUNTER=25)
    m = types.SimpleNamespace(ActivityKind=kinds, enabled=[], flushed=0)

    def enable(k):
        if fail_enable:
            raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")
        m.enabled.append(k)

    m.activity_configure_unified_memory_counter = lambda ptr, n: m.__dict__.update(cfg=(ptr, n))
    m.activity_register_callbacks = lambda req, done: m.__dict__.update(req=req, done=done)
    m.activity_enable = enable
    m.activity_disable = lambda k: m.enabled.remove(k)
    m.activity_flush_all = lambda force: m.__dict__.update(flushed=m.flushed + 1)
    return m


def rec(kind, **kw):
    return types.SimpleNamespace(kind=kind, **kw)


def test_counts_kernels_faults_and_migrations():
    m = fake_cupti()
    obs = C.CuptiObserver(device=0, cupti_module=m)
    assert m.enabled == [10, 25] and m.cfg[1] == 3
    assert m.req() == (8 << 20, 0)
    m.done([rec(10, name="gemm"), rec(10, name="gemm"), rec(10, name="relu"),
            rec(25, counter_kind=4, value=0), rec(25, counter_kind=1, value=2 << 20),
            rec(25, counter_kind=2, value=1 << 20), rec(99)])
    obs.flush()
    r = obs.result()
    assert r["kernels"] == 3 and r["gpu_page_fault_groups"] == 1
    assert r["um_bytes_htod"] == 2 << 20 and r["um_bytes_dtoh"] == 1 << 20
    assert r["top_kernels"][0] == ("gemm", 2) and m.flushed == 1
    obs.close()
    assert m.enabled == []


def test_refusal_is_an_error_the_caller_reports():
    with pytest.raises(RuntimeError, match="CUPTI refused"):
        C.CuptiObserver(cupti_module=fake_cupti(fail_enable=True))


def test_import_guard_says_why():
    ok, why = C.available()
    assert isinstance(ok, bool) and why
    if not ok:
        assert "cupti-python not usable" in why
