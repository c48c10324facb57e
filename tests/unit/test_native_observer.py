"""The C++ observer (``kernels/observer.cpp``) against the reference it replaces, the Python dispatch mode.

GIVEN real training on the CPU (the shipped example script, a GPT-2 small step, bf16 autocast, ops on a second
Python thread, AdamW with its optimizer hooks) observed at once by the C++ observer and by a dispatch mode that
applies the live session's rules (``observer_reference.py``),
WHEN both record the same run,
THEN they agree event for event: the same launches in the same order, with the same execution ids, phases,
byte ranges (storage address, offset, length, read/write) and FLOP counts.
Also: the C++ copy of the dispatcher's decomposition rule agrees with torch's computed dispatch table for every
registered op, and the dtype names hashed into execution ids are Python's.
"""

import runpy
import sys
import threading
from pathlib import Path

import pytest
import torch

from observer_reference import ReferenceMode, native_ops
from uvmprefetch.runtime import native, native_observer
from uvmprefetch.trace.format import PHASE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lib():
    try:
        return native_observer.load()
    except native.NativeBuildError as e:
        pytest.skip(f"the C++ observer cannot be built here: {e}")


class Both:
    """The C++ observer and the reference mode on the same run. ``mode()`` enters the reference on the calling
    thread (a dispatch mode is per thread); the optimizer hooks set both observers' optimizer flag."""

    def __init__(self, lib):
        self.lib, self.ref, self.lock = lib, [], threading.Lock()
        self.in_opt = False

    def mode(self):
        return ReferenceMode(self.ref, self.lock, lambda: self.in_opt)

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        self.lib.drain_ops()
        self.lib.lib.uvmobs_set_optimizer(0)
        self.lib.start("cpu", True)
        self.hooks = [register_optimizer_step_pre_hook(lambda *a: self._opt(True)),
                      register_optimizer_step_post_hook(lambda *a: self._opt(False))]
        return self

    def _opt(self, on):
        self.in_opt = on
        self.lib.lib.uvmobs_set_optimizer(int(on))

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        self.lib.stop()
        self.got = native_ops(self.lib, self.lib.drain_ops())
        assert self.lib.error() == "" and self.lib.counters()["dropped"] == 0


def assert_same(ref, got):
    assert len(ref) > 0
    for i, (r, g) in enumerate(zip(ref, got)):
        assert tuple(r) == tuple(g), f"launch {i}: reference {r[:3]} vs C++ {g[:3]}\n{r}\n{g}"
    assert len(ref) == len(got)


def test_the_shipped_example_script_event_for_event(lib, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["record_me.py", "--steps", "2", "--seq", "32"])
    with Both(lib) as both, both.mode():
        runpy.run_path(str(REPO / "examples" / "record_me.py"), run_name="__main__")
    assert_same(both.ref, both.got)
    phases = {op[2] for op in both.got}
    assert {PHASE["forward"], PHASE["backward"], PHASE["optimizer"]} <= phases


def test_gpt2_small_step_event_for_event(lib):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())  # GPT-2 small: 12 layers, 768 wide, random weights
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 50257, (1, 32))
    with Both(lib) as both, both.mode():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert_same(both.ref, both.got)
    assert sum(op[4] > 0 for op in both.got) >= 48  # the matmuls' FLOPs are counted, forward and backward


def test_autocast_and_a_second_thread_event_for_event(lib):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 16))
    x = torch.randn(8, 64)

    def work():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x).float().pow(2).mean()
        y.backward()

    with Both(lib) as both:
        with both.mode():
            work()

        def other():
            with both.mode():
                work()
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with both.mode():
            torch.ones(5).add_(1)
    assert_same(both.ref, both.got)
    names = [op[0] for op in both.got]
    assert names.count("aten::_to_copy") >= 4  # the casts autocast makes are seen, on both threads


def test_concurrent_threads_see_the_same_multiset(lib):
    from collections import Counter
    torch.manual_seed(0)
    ws = [torch.randn(32, 32, requires_grad=True) for _ in range(2)]

    def work(w):
        with both.mode():
            for _ in range(20):
                (torch.randn(4, 32) @ w).tanh().sum().backward()
    with Both(lib) as both:
        ts = [threading.Thread(target=work, args=(w,)) for w in ws]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert Counter(both.ref) == Counter(both.got) and len(both.got) > 2 * 20 * 5


def test_decomposition_rule_matches_the_dispatch_table(lib):
    """The C++ observer's reading of the dispatcher (which ops decompose above the dispatch mode) for every
    registered op, on both backends, against torch's computed table."""
    import ctypes
    C = torch._C
    out = (ctypes.c_int * 4)()
    checked = 0
    for op in C._dispatch_get_all_op_names():
        name, _, overload = op.partition(".")
        table = C._dispatch_dump_table(op)
        for dev, code in (("CPU", 0), ("CUDA", 1)):
            lib.lib.uvmobs_op_facts(name.encode(), overload.encode(), code, out)
            if not out[0]:
                continue
            line = [ln for ln in table.splitlines() if ln.startswith(f"Autograd{dev}:")]
            truth = bool(line) and "[math kernel]" in line[0]
            assert bool(out[2]) == truth, f"{op} on {dev}: C++ says decomposes={bool(out[2])}, table: {line[:1]}"
            checked += 1
    assert checked > 5000


@torch.jit.script
def _dtype_code(d: torch.dtype) -> int:
    return d


def test_dtype_names_are_pythons(lib):
    dtypes = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    for d in dtypes:
        assert lib.lib.uvmobs_dtype_name(_dtype_code(d)).decode() == str(d)[6:]


def test_an_exception_inside_the_observer_switches_it_off_and_the_op_is_untouched(lib):
    lib.lib.uvmobs_test_fail_after(0)
    try:
        lib.start("cpu", True)
        a = torch.arange(6.0)
        b = a * 3  # the callback throws inside; the op must still compute
        assert torch.equal(b, torch.tensor([0.0, 3, 6, 9, 12, 15]))
        assert lib.state() == native_observer.STATE_FAILED
        assert "injected observer failure" in lib.error()
    finally:
        lib.lib.uvmobs_test_fail_after(-1)
        lib.stop()


def test_a_wrapper_subclass_is_seen_through_its_inner_tensors(lib):
    # A __torch_dispatch__ subclass that owns no memory (as DTensor does for FSDP2) runs each op on its inner
    # tensor: the C++ observer records those inner calls, with the inner tensor's bytes.
    from torch.utils._pytree import tree_map

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        def __tensor_flatten__(self):
            return ["inner"], None

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda x: x.inner if isinstance(x, Wrapper) else x  # noqa: E731
            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
            return tree_map(lambda x: Wrapper(x) if isinstance(x, torch.Tensor) else x, out)

    inner = torch.arange(16.0)
    w = Wrapper(inner)
    lib.drain_ops()
    lib.start("cpu", True)
    try:
        w.mul_(2)
    finally:
        lib.stop()
    got = native_ops(lib, lib.drain_ops())
    assert [op[0] for op in got] == ["aten::mul_.Tensor"]
    assert got[0][3][0][:3] == (inner.untyped_storage().data_ptr(), 0, 64)  # the inner tensor's 64 bytes
    assert torch.equal(inner, torch.arange(16.0) * 2)
