"""The copy path of the cuda backend (``runtime/copyout.py``) on the CPU, with fakes only at the CUDA boundary.

GIVEN a managed arena and pinned slots that are real host memory, and a fake ``cuda.bindings.runtime`` whose
``cudaMemcpyAsync`` / ``cudaMemcpy`` move those real bytes, whose discard overwrites its ranges with garbage and
whose prefetch does nothing (the bytes stay where they are, as on a GPU);
WHEN blocks are evicted by copy, brought back, demanded by ops through the real pre-op gate, or a call fails or a
kernel nobody observed is launched;
THEN every byte a tensor held is there again, byte for byte; an op on a mirrored block does not pass the gate
before its copy-in is queued and then waits on that copy's event; the mirror pool stays under its cap and says so;
a failure or an unattributed launch copies every mirror back and switches the path off for the run.
"""

import ctypes
import threading
import types

import numpy as np
import pytest

from uvmprefetch.config import DEFAULT_HOST_LIMIT, HostLimit, from_env, parse_host_limit
from uvmprefetch.errors import ConfigError
from uvmprefetch.policy.base import EvictPath
from uvmprefetch.runtime.copyout import CopyOut, MirrorPool, ObservedAllocations, copy_wanted, discard_ranges
from uvmprefetch.runtime.liveness import EVENT_DTYPE, FREE_COMPLETED, ALLOC

# the observer library with its gate, resolved against test_gate.py's fake libcudart (it logs the waits)
from test_gate import gate  # noqa: F401 - the fixture

BS = 2 << 20
SH = 21


# ------------------------------------------------------------------------------------------------ configuration
def test_evict_and_host_limit_variables():
    cfg = from_env({}, check_policy=False)
    assert cfg.evict == "uvm" and cfg.host_limit == DEFAULT_HOST_LIMIT == HostLimit(fraction=0.25)
    cfg = from_env({"UVMPREFETCH_EVICT": "AUTO", "UVMPREFETCH_HOST_LIMIT": "8GiB"}, check_policy=False)
    assert cfg.evict == "auto" and cfg.host_limit.resolve(1 << 40) == 8 << 30
    assert from_env(cfg.to_env(), check_policy=False).host_limit == cfg.host_limit  # `uvmprefetch run` round trip
    assert parse_host_limit("30%").resolve(100 << 30) == 30 << 30
    assert parse_host_limit("0").resolve(100 << 30) == 0
    assert parse_host_limit("1073741824").resolve(1) == 1 << 30
    for bad in ("copy", "1"):
        with pytest.raises(ConfigError, match="UVMPREFETCH_EVICT='.*' is invalid; accepted: uvm"):
            from_env({"UVMPREFETCH_EVICT": bad}, check_policy=False)
    for bad in ("lots", "150%", "0%", "-3GiB", "0.5"):
        with pytest.raises(ConfigError, match="UVMPREFETCH_HOST_LIMIT=.* is invalid; accepted: pinned host memory"):
            from_env({"UVMPREFETCH_HOST_LIMIT": bad}, check_policy=False)


def test_copy_wanted_follows_the_simulators_rule():
    dec = np.array([5, 6, 7, 8])
    path = np.array([EvictPath.COPY, EvictPath.UVM, EvictPath.DEFAULT, EvictPath.DEFAULT])
    out = np.array([5, 6, 7, 9])  # 8 was dropped (protected), 9 is a budget victim
    assert copy_wanted(out, dec, path, default_copy=True).tolist() == [True, False, True, True]
    assert copy_wanted(out, dec, path, default_copy=False).tolist() == [True, False, False, False]
    assert copy_wanted(out, dec, np.zeros(0, dtype=np.int8), default_copy=True).all()


def test_discards_cover_only_whole_pages_of_mirrored_bytes():
    K = 64 << 10
    # two touching allocations merge; the ends are cut inward to 64 KiB; a range inside one page is not discarded
    assert discard_ranges([(K + 512, 3 * K), (4 * K + 512, K)], K) == [(2 * K, 3 * K)]
    assert discard_ranges([(10 * K + 512, 1024)], K) == []
    assert discard_ranges([(0, 2 << 20)], K) == [(0, 2 << 20)]


# ------------------------------------------------------------------------------------------------ the book, the pool
def _events(*rows):
    ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for k, (seq, action, addr, size) in enumerate(rows):
        ev[k] = (seq, addr, size, 0, action, 0)
    return ev


def parts(book, lo, hi):
    r = book.ranges_in(lo, hi)
    return None if r is None else [(p, n) for p, n, _, _ in r]


def test_eligibility_needs_a_complete_stream_and_every_allocation_observed():
    seen = set()
    book = ObservedAllocations(observed=seen.__contains__)
    base = 0x7F0000000000
    book.feed(_events((1, ALLOC, base, 1 << 20), (2, ALLOC, base + (1 << 20), 4096), (3, ALLOC, base + BS, BS)))
    seen.update({base, base + BS})
    assert parts(book, base, base + BS) is None  # incomplete: nothing is eligible
    book.set_complete(True)
    assert parts(book, base, base + BS) is None  # the 4 KiB allocation (a workspace) no op touched
    assert parts(book, base + BS, base + 2 * BS) == [(base + BS, BS)]
    seen.add(base + (1 << 20))
    assert parts(book, base, base + BS) == [(base, 1 << 20), (base + (1 << 20), 4096)]
    # events are applied up to the op being planned: a reuse of the address after it does not count yet
    book.feed(_events((10, FREE_COMPLETED, base + (1 << 20), 4096), (12, ALLOC, base + (1 << 20), 8192)))
    book.upto = 11
    assert parts(book, base, base + BS) == [(base, 1 << 20)]
    book.upto = 13
    assert parts(book, base, base + BS) == [(base, 1 << 20), (base + (1 << 20), 8192)]
    assert parts(book, base + 3 * BS, base + 4 * BS) == []  # no live allocation: nothing to copy


def test_mirror_pool_is_bounded_reports_and_falls_back():
    allocs, frees = [], []

    def alloc(n):
        allocs.append(n)
        return 0x1000_0000 * len(allocs)
    pool = MirrorPool(5 * BS, BS, alloc, frees.append, slab_blocks=2)
    slots = [pool.take() for _ in range(7)]
    assert slots[5] is None and slots[6] is None and len(set(slots[:5])) == 5
    assert allocs == [2 * BS, 2 * BS, BS]  # slabs, the last one cut at the cap
    r = pool.result()
    assert r["cap_bytes"] == r["pinned_bytes"] == r["peak_bytes"] == r["current_bytes"] == 5 * BS
    assert r["fallbacks"] == 2
    pool.give(slots[0])
    assert pool.take() == slots[0] and pool.result()["peak_bytes"] == 5 * BS
    pool.close()
    assert len(frees) == 3

    def broke(n):
        raise RuntimeError("cudaErrorMemoryAllocation")
    p2 = MirrorPool(4 * BS, BS, broke, frees.append)
    assert p2.take() is None and "pinned allocation" in p2.result()["alloc_error"]


# ------------------------------------------------------------------------------------------------ fakes at the boundary
class Arena:
    """Real host memory standing in for managed memory (2 MiB aligned blocks) and for pinned memory."""

    def __init__(self, nblocks):
        self.raw = ctypes.create_string_buffer((nblocks + 1) * BS)
        self.base = (ctypes.addressof(self.raw) + BS - 1) // BS * BS
        self.pinned = []

    def view(self, addr, n):
        return (ctypes.c_ubyte * n).from_address(addr)

    def host(self, n):
        buf = ctypes.create_string_buffer(n)
        self.pinned.append(buf)
        return ctypes.addressof(buf)


class FakeRuntime:
    """``cuda.bindings.runtime`` at the boundary: copies move real bytes at once; a discard fills its ranges with
    0xA5 (a discarded page's contents are undefined); ``fail`` names a call that fails from its ``fail_at``-th use."""

    class cudaError_t:
        cudaSuccess = 0
        cudaErrorInvalidValue = 1

    class cudaMemcpyKind:
        cudaMemcpyDefault = 4

    def __init__(self, arena, fail=None, fail_at=1):
        self.arena, self.fail, self.fail_at = arena, fail, fail_at
        self.calls = []

    def _ret(self, name, *result):
        self.calls.append(name)
        if name == self.fail and self.calls.count(name) >= self.fail_at:
            return (1,)
        return (0, *result)

    def cudaMemcpyAsync(self, dst, src, n, kind, stream):
        res = self._ret("cudaMemcpyAsync", )
        if res[0] == 0:
            ctypes.memmove(dst, src, n)
        return res

    def cudaMemcpy(self, dst, src, n, kind):
        res = self._ret("cudaMemcpy")
        if res[0] == 0:
            ctypes.memmove(dst, src, n)
        return res

    def cudaMemDiscardBatchAsync(self, ptrs, sizes, count, flags, stream):
        assert len(ptrs) == len(sizes) == count
        res = self._ret("cudaMemDiscardBatchAsync")
        if res[0] == 0:
            for p, n in zip(ptrs, sizes):
                ctypes.memset(p, 0xA5, n)
        return res

    def cudaMemPrefetchAsync(self, p, n, loc, flags, stream):
        return self._ret("cudaMemPrefetchAsync")

    def cudaStreamSynchronize(self, stream):
        return self._ret("cudaStreamSynchronize")

    def cudaMallocHost(self, n):
        return self._ret("cudaMallocHost", self.arena.host(n))

    def cudaFreeHost(self, p):
        return self._ret("cudaFreeHost")

    def cudaGetErrorName(self, err):
        return (0, b"cudaErrorInvalidValue")


class Stream:
    cuda_stream = 11

    def __init__(self, log):
        self.log = log

    def wait_stream(self, other):
        self.log.append(("wait_stream", other))


class Event:
    n = 0

    def __init__(self):
        Event.n += 1
        self.cuda_event = 0x1000 * Event.n  # what the gate is handed (8-byte aligned)
        self.recorded = False

    def record(self, stream):
        self.recorded = True

    def query(self):
        return False  # still in flight: the gate keeps the block "to the GPU" with this event


def fake_mover(arena, fail=None, fail_at=1, gate=None):
    from uvmprefetch.runtime.mover import Mover
    m = object.__new__(Mover)
    m.rt, m.device, m.calls, m.thread, m.gate = FakeRuntime(arena, fail, fail_at), 0, 0, None, gate
    m.log = []
    m.stream = Stream(m.log)
    m.dev_loc = types.SimpleNamespace(type=1, id=0)
    m.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=lambda dev: "compute", Event=Event))
    return m


def setup(nblocks=6, fail=None, fail_at=1, gate=None, cap_blocks=8, unobserved=()):
    """Blocks 0..nblocks-1 of the arena, each holding two allocations (1.5 MiB + 0.5 MiB) with distinct bytes."""
    arena = Arena(nblocks)
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, nblocks * BS, dtype=np.uint8)
    ctypes.memmove(arena.base, data.ctypes.data, data.size)
    allocs = [(arena.base + b * BS + off, n) for b in range(nblocks) for off, n in ((0, 3 << 19), (3 << 19, 1 << 19))]
    seen = {a for a, _ in allocs} - set(unobserved)
    book = ObservedAllocations(observed=seen.__contains__)
    book.feed(_events(*[(k + 1, ALLOC, a, n) for k, (a, n) in enumerate(allocs)]))
    book.set_complete(True)
    mv = fake_mover(arena, fail, fail_at, gate)
    pool = MirrorPool(cap_blocks * BS, BS, lambda n: mv._check(mv.rt.cudaMallocHost(n), "h")[1], lambda p: None)
    cp = CopyOut(mv, book, pool, BS)
    return arena, data, cp


def now(arena, nblocks):
    return np.frombuffer(arena.view(arena.base, nblocks * BS), dtype=np.uint8).copy()


def evict(cp, arena, ids, want=True):
    ids = np.asarray(ids, dtype=np.int64)
    return cp.evict(ids, arena.base + ids * BS, np.full(ids.size, want)).tolist()


def test_copy_out_and_back_keeps_every_byte_and_accounts_the_mirrors(capsys):
    arena, data, cp = setup()
    assert evict(cp, arena, [1, 2, 4]) == []  # all taken by the copy path
    cur = now(arena, 6)
    for b in (1, 2, 4):
        assert (cur[b * BS:(b + 1) * BS] == 0xA5).all()  # discarded on the "GPU"
    assert np.array_equal(cur[:BS], data[:BS])  # untouched blocks keep their data
    assert cp.mirrored(np.array([0, 1, 2, 4])).tolist() == [False, True, True, True]
    r = cp.result()
    assert r["copy_evictions"] == 3 and r["copy_out_bytes"] == 3 * BS and r["mirror"]["current_bytes"] == 3 * BS
    # the calls, in order: copies of both allocations of each block, then one discard of them all
    assert cp.mv.rt.calls == ["cudaMallocHost"] + ["cudaMemcpyAsync"] * 6 + ["cudaMemDiscardBatchAsync"]
    assert cp.mv.log == [("wait_stream", "compute")]  # after the kernels already queued on the compute stream
    cp.bring_in(np.array([4, 2]))
    cp.bring_in(np.array([1]))
    assert np.array_equal(now(arena, 6), data)  # byte for byte
    r = cp.result()
    assert r["copy_ins"] == 3 and r["copy_in_bytes"] == 3 * BS and r["mirror"]["current_bytes"] == 0
    assert r["mirror"]["peak_bytes"] == 3 * BS and r["on"] is True and capsys.readouterr().err == ""
    # prefetches to the GPU (repopulate without a copy) come before the copies in
    tail = cp.mv.rt.calls[8:]
    assert tail[:4] == ["cudaMemPrefetchAsync"] * 4 and tail[4:8] == ["cudaMemcpyAsync"] * 4


def test_ineligible_blocks_and_a_full_pool_leave_by_uvm():
    arena, data, cp = setup(cap_blocks=2, unobserved=[])
    w = arena.base + 3 * BS + (3 << 19)  # block 3's second allocation: no observed op touched it (a workspace)
    cp.book.observed = lambda a: a != w
    assert evict(cp, arena, [0, 3, 5, 1], want=True) == [3, 1]  # 3 ineligible; 1 over the pool's cap
    assert evict(cp, arena, [2], want=False) == [2]  # the policy chose UVM for it
    r = cp.result()
    assert r["ineligible_evictions"] == 1 and r["mirror_full_evictions"] == 1 and r["copy_evictions"] == 2
    assert r["mirror"]["fallbacks"] == 1 and r["mirror"]["cap_bytes"] == 2 * BS
    assert np.array_equal(now(arena, 6)[3 * BS:4 * BS], data[3 * BS:4 * BS])  # never discarded


@pytest.mark.parametrize("fail,fail_at", [("cudaMemcpyAsync", 2), ("cudaMemDiscardBatchAsync", 1),
                                          ("cudaMemPrefetchAsync", 1), ("cudaMemcpyAsync", 8)])
def test_a_failed_call_restores_every_range_and_switches_the_path_off(fail, fail_at, capsys):
    arena, data, cp = setup(fail=fail, fail_at=fail_at)
    evict(cp, arena, [1, 2, 4])  # copies 1-6 and the discard
    cp.bring_in(np.array([2]))  # the 7th and 8th copies are block 2's copy-in
    assert np.array_equal(now(arena, 6), data)  # whatever failed, every byte is back
    r = cp.result()
    assert r["on"] is False and fail in r["off_reason"] and r["mirrors"] == 0 and r["mirror"]["current_bytes"] == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the copy path is off for the rest of this run" in err
    assert evict(cp, arena, [0, 3]) == [0, 3]  # from now on every eviction is UVM's


def test_an_unattributed_launch_restores_every_mirror_before_anything_else(capsys):
    arena, data, cp = setup()
    evict(cp, arena, [0, 1, 2, 3])
    cp.bring_in(np.array([1]))
    assert (now(arena, 6)[0:BS] == 0xA5).all()
    cp.unattributed()  # what the shim calls, on the launching thread, before it queues the kernel
    assert np.array_equal(now(arena, 6), data)
    assert cp.result()["on"] is False and cp.result()["restored_blocks"] == 3
    assert "launched outside every op" in capsys.readouterr().err
    assert evict(cp, arena, [5]) == [5]


def test_close_puts_the_mirrors_back():
    arena, data, cp = setup()
    evict(cp, arena, [2, 5])
    cp.close()
    assert np.array_equal(now(arena, 6), data)


# ------------------------------------------------------------------------------------------------ the gate
def test_an_op_on_a_mirrored_block_waits_for_its_copy_in_and_then_on_its_event(gate):
    """The op's thread holds the GIL (a PyDLL call, as a Python training loop calling an op): the gate must let
    it go while it waits, or the mover thread that serves the demand could never run."""
    from uvmprefetch.runtime.mover import GateBook
    lib, fake = gate
    assert lib.lib.uvmgate_use_gil() == 1
    book = GateBook(lib, BS)
    arena, data, cp = setup(gate=book)
    evict(cp, arena, [3])
    blk = (arena.base >> SH) + 3
    out = np.zeros(1, dtype=np.uint64)
    held = ctypes.PyDLL(lib.lib._name)
    held.uvmgate_check.argtypes = lib.lib.uvmgate_check.argtypes
    starts = np.array([arena.base + 3 * BS + 4096], dtype=np.uint64)
    lens = np.array([8192], dtype=np.uint64)
    res = (ctypes.c_uint32 * 3)()
    n0 = ctypes.c_int.in_dll(fake, "n_waits").value
    done = threading.Event()

    def op():
        held.uvmgate_check(starts.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                           lens.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), 1, ctypes.c_void_p(0x77), res)
        done.set()
    t = threading.Thread(target=op)
    t.start()
    assert not done.wait(0.3)  # the op does not pass the gate: its block is mirrored, no copy-in queued
    assert (now(arena, 6)[3 * BS:4 * BS] == 0xA5).all()
    for _ in range(200):  # the mover's service loop (every ~2 ms), here by hand
        cp.serve()
        if done.wait(0.01):
            break
    t.join(5)
    assert done.is_set()
    assert np.array_equal(now(arena, 6), data)  # the copy-in ran before the op went on
    assert tuple(res)[0] == 1 and tuple(res)[2] == 1  # then it waited on the copy's event, as a late prefetch
    ev = ctypes.c_void_p.from_address(ctypes.addressof((ctypes.c_void_p * 64).in_dll(fake, "wait_event")) + 8 * n0)
    assert ev.value == Event.n * 0x1000
    assert cp.result()["demand_copy_ins"] == 1 and cp.result()["gate_demanded_blocks"] >= 1
    lib.lib.uvmgate_get(np.array([blk], dtype=np.uint64).ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), 1,
                        out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)))
    assert int(out[0]) & 7 == 2  # in flight to the GPU with the copy's event


def test_switching_off_releases_ops_waiting_at_the_gate(gate):
    from uvmprefetch.runtime.mover import GateBook
    lib, _ = gate
    arena, data, cp = setup(gate=GateBook(lib, BS))
    evict(cp, arena, [1])
    starts = np.array([arena.base + BS], dtype=np.uint64)
    lens = np.array([BS], dtype=np.uint64)
    res = (ctypes.c_uint32 * 3)()
    t = threading.Thread(target=lambda: lib.lib.uvmgate_check(starts.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                                                              lens.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)),
                                                              1, ctypes.c_void_p(0x77), res))
    t.start()
    t.join(0.2)
    assert t.is_alive()
    cp.unattributed()
    t.join(5)
    assert not t.is_alive() and np.array_equal(now(arena, 6), data)
    lib.lib.uvmgate_take_demands(np.zeros(64, dtype=np.uint64).ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), 64)


# ------------------------------------------------------------------------------------------------ the shim
SHIM_SCRIPT = r"""
inside = [1]
seen = []
in_op = ctypes.CFUNCTYPE(ctypes.c_int)(lambda: inside[0])
cb = ctypes.CFUNCTYPE(None)(lambda: seen.append(launched()))
shim.uvmshim_set_attribution.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
shim.uvmshim_set_attribution(ctypes.cast(in_op, ctypes.c_void_p), ctypes.cast(cb, ctypes.c_void_p))
shim.uvmshim_unattributed.restype = ctypes.c_uint64
inside[0] = 0; go()                       # no mirrors: launches are not checked
shim.uvmshim_set_mirrors(1)
inside[0] = 1; go()                       # inside an observed op
inside[0] = 0; go()                       # outside every op: the callback first, then the launch
inside[0] = 1; shim.cudaGraphLaunch(None, None)  # a graph's replay: never attributed, even inside an op
print(seen, shim.uvmshim_unattributed(), launched())
"""


def test_shim_calls_back_before_queuing_a_kernel_no_observed_op_launched(tmp_path):
    from fake_launch import run_with_shim
    r = run_with_shim(tmp_path, SHIM_SCRIPT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    # the callback ran when 2 launches had gone through (not 3: it ran before the third was queued), and before the
    # graph's replay (3, not 4)
    assert r.stdout.split() == ["[2,", "3]", "2", "4"]


# ------------------------------------------------------------------------------------------------ dryrun, end to end
def test_dryrun_training_under_evict_auto_keeps_the_losses_and_uses_the_copy_path(tmp_path):
    """A real CPU training run (the shipped GPT-2 example) under ``UVMPREFETCH_EVICT=auto``: the simulated GPU
    (a calibrated profile: it has the copy path) evicts by copy-out, within the mirror cap, and the losses are
    those of the run without the runtime, bit for bit."""
    import json

    from test_runtime_dryrun import _run

    def run(name, **extra):
        return _run(tmp_path, name, extra)[0]
    plain = run("plain")
    report = tmp_path / "report.json"
    live = run("auto", UVMPREFETCH="1", UVMPREFETCH_BACKEND="dryrun", UVMPREFETCH_BUDGET=str(24 << 20),
               UVMPREFETCH_GPU="h100-pcie-cal", UVMPREFETCH_EVICT="auto", UVMPREFETCH_HOST_LIMIT="16MiB",
               UVMPREFETCH_REPORT=str(report))
    assert live["losses_hex"] == plain["losses_hex"]
    rep = json.loads(report.read_text())
    be = rep["backend_result"]
    assert not rep["degraded"] and rep["errors"] == [] and be["evict"] == "auto"
    assert be["copy_evictions"] > 0 and be["copy_out_bytes"] > 0 and be["copy_in_bytes"] > 0
    assert 0 < be["mirror_peak_bytes"] <= 16 << 20 and be["mirror_full_evictions"] > 0  # the cap held


# ------------------------------------------------------------------------------------------------ the backend's hooks
def test_the_backend_sends_copy_evictions_and_their_prefetches_through_the_copy_path():
    """The real ``CudaBackend.launch`` (CUDA replaced at the Mover, as in test_runtime_cuda_logic): the evictions the
    policy marks COPY and the copy path can take leave by copy, the rest by UVM; a later prefetch of a mirrored
    block is its copy-in, never a UVM prefetch."""
    import test_runtime_cuda_logic as logic
    from test_runtime_cuda_logic import Scripted, backend, info

    from uvmprefetch.policy.base import Decision
    arena, data, cp = setup(nblocks=6)
    base = arena.base
    pol = Scripted([None,
                    Decision(evict=np.array([0, 1, 2]),
                             evict_path=np.array([EvictPath.COPY, EvictPath.UVM, EvictPath.DEFAULT])),
                    Decision(prefetch=np.array([0, 1, 2]))])
    pol.evict_path = EvictPath.UVM  # DEFAULT means UVM for this policy
    be = backend(pol, 8, [(base, 6 * BS)], discard=False)
    be.copy = cp
    be.progress.seq = 0
    be.launch(info(0, be, base, 6 * BS))  # touches blocks 0-5 (dense ids follow first sight: id k = block k)
    logic.Event.done = 10**6  # the GPU has passed launch 0: its blocks may leave
    be.launch(info(1, be, base + 5 * BS, BS))
    assert cp.mirrored(np.arange(6)).tolist() == [True, False, False, False, False, False]
    assert be.mover.log[0] == ("to_host", [(base + BS, 2 * BS)], 0)  # 1 (UVM) and 2 (DEFAULT = UVM)
    be.launch(info(2, be, base + 5 * BS, BS))
    assert ("to_gpu", [(base + BS, 2 * BS)], 0) in be.mover.log  # 1 and 2 come back by UVM prefetch
    assert not any(e[0] == "to_gpu" and base in [p for p, _ in e[1]] for e in be.mover.log)
    assert cp.result()["copy_ins"] == 1 and np.array_equal(now(arena, 6), data)  # 0 by its copy-in


def _ranges(*pairs):
    s = np.array([p for p, _ in pairs], dtype=np.uint64)
    n = np.array([k for _, k in pairs], dtype=np.uint64)
    return s, n, s.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), n.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))


class OpThread:
    """A thread that runs an op's start callback (the gate check) and later its end callback, on command: the
    gate counts ops per thread, as the observer calls them."""

    def __init__(self, L, ranges):
        import queue
        self.L, self.ranges, self.q, self.res = L, ranges, queue.Queue(), (ctypes.c_uint32 * 3)()
        self.begun, self.ended = threading.Event(), threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        r = self.ranges
        self.L.uvmgate_begin(r[2], r[3], len(r[0]), ctypes.c_void_p(0x77), self.res)
        self.begun.set()
        self.q.get()
        self.L.uvmgate_end()
        self.ended.set()

    def end(self):
        self.q.put(1)
        assert self.ended.wait(5)


def test_a_copy_out_waits_for_ops_past_the_gate_and_not_for_ops_blocked_in_it(gate):
    """An op that passed its gate check before its block was marked mirrored may still be queuing kernels that use
    it: the copy-out waits for its end. An op blocked on a demand is not waited for (that would deadlock), and when
    it resumes it checks every block again (one it passed may have been marked meanwhile)."""
    lib, _ = gate
    L = lib.lib
    base = 0x7E0000000000
    a, b = base >> SH, (base >> SH) + 1

    def state(blocks, st):
        arr = np.asarray(blocks, dtype=np.uint64)
        L.uvmgate_set(arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), arr.size, 0, st)
    state([a, b], 1)
    past = OpThread(L, _ranges((base, 4096)))
    assert past.begun.wait(5)  # past the gate on block a (resident); its kernels not queued yet
    state([a], 6)
    assert L.uvmgate_quiesce(100) == -1  # the copy-out of a must wait for it
    past.end()
    assert L.uvmgate_quiesce(100) == 0
    state([a], 1)
    state([b], 6)
    blocked = OpThread(L, _ranges((base, 4096), (base + BS, 4096)))  # a resident, b mirrored: blocks on b
    assert not blocked.begun.wait(0.2)
    assert L.uvmgate_quiesce(100) == 0  # not waited for: it is blocked, not queuing kernels
    state([a], 6)  # a marked meanwhile
    state([b], 1)  # b's copy-in queued
    assert not blocked.begun.wait(0.2)  # resumed, checked every block again, now waits for a
    state([a], 1)
    assert blocked.begun.wait(5)
    assert L.uvmgate_quiesce(100) == -1
    blocked.end()
    assert L.uvmgate_quiesce(100) == 0
    L.uvmgate_take_demands(np.zeros(64, dtype=np.uint64).ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), 64)


def test_a_copy_out_that_cannot_wait_for_an_op_leaves_by_uvm(gate, monkeypatch):
    from uvmprefetch.runtime import copyout
    from uvmprefetch.runtime.mover import GateBook
    lib, _ = gate
    monkeypatch.setattr(copyout, "QUIESCE_MS", 50)
    arena, data, cp = setup(gate=GateBook(lib, BS))
    mv = cp.mv
    mv.batch, mv.host_loc, mv.on_main = False, types.SimpleNamespace(type=2, id=0), None
    op = OpThread(lib.lib, _ranges((arena.base + 2 * BS, 4096)))  # past the gate on block 2, not ended
    assert op.begun.wait(5)
    evict(cp, arena, [2, 3])
    r = cp.result()
    assert r["quiesce_timeouts"] == 1 and r["copy_evictions"] == 0 and r["mirrors"] == 0
    assert r["mirror"]["current_bytes"] == 0 and r["on"] is True
    assert mv.rt.calls.count("cudaMemPrefetchAsync") == 4  # both blocks' allocations evicted by UVM instead
    assert np.array_equal(now(arena, 6), data)  # nothing was discarded
    op.end()


def test_the_mover_thread_runs_the_copies_in_order_under_backpressure():
    """With the real ``MoveThread`` (a queue of at most one block's bytes: every submit waits for the mover), copy-outs
    and copy-ins submitted from another thread run in order and leave every byte in place."""
    from uvmprefetch.runtime.mover import MoveThread
    arena, data, cp = setup(nblocks=6, cap_blocks=3)
    cp.mv.thread = MoveThread(0, max_pending=BS)
    cp.mv.thread.service = cp.serve

    def planner():
        for rnd in range(3):
            for b in range(6):
                evict(cp, arena, [b])
                if b >= 2:
                    cp.bring_in(np.array([b - 2]))
            cp.bring_in(np.arange(6))
    t = threading.Thread(target=planner)
    t.start()
    t.join(30)
    assert not t.is_alive()
    cp.mv.thread.drain()
    cp.mv.thread.close()
    assert np.array_equal(now(arena, 6), data)
    r = cp.result()
    # a slot comes back when its copy-in runs on the mover thread: until then a full pool sends evictions to UVM
    assert r["copy_evictions"] == r["copy_ins"] and r["copy_evictions"] + r["mirror_full_evictions"] == 18
    assert r["copy_evictions"] >= 3 and r["mirror"]["peak_bytes"] <= 3 * BS and r["on"] is True


def test_a_dead_allocations_bytes_are_never_copied_back_over_its_successor():
    """One allocation of a mirrored block dies and its memory goes to another (a workspace no op touched, written
    by a kernel the copy path never sees): the copy-in brings back only the allocation still alive. A block whose
    tensors all died is forgotten: no copy-in, the gate lets ops over it go."""
    arena, data, cp = setup()
    evict(cp, arena, [1, 4])
    lo = arena.base + BS + (3 << 19)  # block 1's second allocation (0.5 MiB) dies; a new one takes its place
    cp.book.feed(_events((100, FREE_COMPLETED, lo, 1 << 19), (101, ALLOC, lo, 1 << 19)))
    cp.book.upto = None
    cp.book.ranges_in(0, 1)  # (the planner applies the events at its next eviction)
    ctypes.memset(lo, 0x3C, 1 << 19)  # the successor's data
    cp.forget(np.array([4]))
    cp.bring_in(np.array([1, 4]))
    cur = now(arena, 6)
    assert np.array_equal(cur[BS:BS + (3 << 19)], data[BS:BS + (3 << 19)])  # the live one is back
    assert (cur[BS + (3 << 19):2 * BS] == 0x3C).all()  # the successor's bytes untouched
    r = cp.result()
    assert r["stale_ranges"] == 1 and r["forgotten"] == 1 and r["copy_ins"] == 1 and r["mirrors"] == 0
    assert r["mirror"]["current_bytes"] == 0


def test_torch_compile_switches_the_path_off_before_a_compiled_graph_runs(capsys):
    """The real ``torch._dynamo`` start-of-compile callback, as ``copyout.start`` registers it: compiling a graph
    copies every mirror back and switches the path off before the compiled code first runs."""
    import torch
    import torch._dynamo.callback as dynamo_callback

    arena, data, cp = setup()
    evict(cp, arena, [0, 5])
    torch._dynamo.reset()  # (it also drops the compile callbacks)
    dynamo_callback.on_compile_start(cp.compiling)
    try:
        f = torch.compile(lambda x: x * 2 + 1, backend="eager")
        assert f(torch.ones(3)).tolist() == [3.0, 3.0, 3.0]
    finally:
        dynamo_callback.callback_handler.clear()
        torch._dynamo.reset()
    assert np.array_equal(now(arena, 6), data)
    r = cp.result()
    assert r["on"] is False and "torch.compile" in r["off_reason"] and r["restored_blocks"] == 2
    assert "torch.compile is compiling" in capsys.readouterr().err


def test_a_graph_compiled_without_the_callback_is_caught_at_the_next_eviction(capsys):
    """``torch._dynamo.reset()`` drops the start-of-compile callbacks: the planner also compares dynamo's graph count
    at each eviction and switches the path off when it grew."""
    import torch

    arena, data, cp = setup()
    evict(cp, arena, [1])
    torch._dynamo.reset()
    try:
        assert torch.compile(lambda x: x - 1, backend="eager")(torch.ones(2)).tolist() == [0.0, 0.0]
    finally:
        torch._dynamo.reset()
    assert evict(cp, arena, [2]) == [2]  # UVM's, and every mirror is back
    assert np.array_equal(now(arena, 6), data) and cp.result()["on"] is False
    assert "torch.compile" in capsys.readouterr().err


def test_the_backends_copy_book_is_whole_only_while_the_allocator_feed_covered_every_allocation():
    # GIVEN a cuda backend (its allocator-event hook alone) whose feed attached before the first allocation,
    # and the copy path's book of observed allocations
    from uvmprefetch.runtime.cuda_backend import CudaBackend
    base, seen = 1 << 32, set()
    book = ObservedAllocations(observed=seen.__contains__)
    b = object.__new__(CudaBackend)
    b.copy = types.SimpleNamespace(book=book)
    b.feed = types.SimpleNamespace(liveness=types.SimpleNamespace(unknown=None))
    b._copy_books, b._copy_books_why = True, ""
    seen.add(base)
    # WHEN the planner hands it events (a CPU allocator's event, device -1, among them)
    cpu = _events((2, ALLOC, base + BS, BS))
    cpu["device"] = -1
    b.allocator_events(np.concatenate([_events((1, ALLOC, base, BS)), cpu]))
    # THEN the book is whole and holds the GPU allocation only
    assert book.complete and parts(book, base, base + BS) == [(base, BS)]
    assert parts(book, base + BS, base + 2 * BS) == []
    # WHEN the feed's books get a hole (an overflow), then are rebuilt (a snapshot at an iteration end)
    b.feed.liveness.unknown = "the allocator's ring overflowed"
    b.allocator_events(_events((3, ALLOC, base + 2 * BS, BS)))
    assert not book.complete and "overflowed" in book.why
    b.feed.liveness.unknown = None
    b.allocator_events(_events((4, ALLOC, base + 3 * BS, BS)))
    # THEN the book stays incomplete for the run: nothing is eligible (it never saw what lived across the hole)
    assert not book.complete and parts(book, base, base + BS) is None
