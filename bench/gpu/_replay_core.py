"""The GPU trace replay's loop, independent of what runs it: a real GPU (``_replay_cuda``) or the CPU fake
(``_replay_fake``), and of how the live runtime is reached (``_replay_runtime``, the one module that imports it).

A trace's allocations are laid out as the simulator lays them out (``uvmprefetch.sim.layout.build_layout``) and
that address space becomes one managed allocation, the *arena*, 2 MiB aligned: layout block ``b`` is the arena's
``b``-th 2 MiB block, so the GPU replay and the simulator's prediction see the same blocks. Each launch becomes
one touch kernel (``kernels/touch.cu``) over its byte ranges (``touch_plan``), launched on one stream in trace
order; the launch goes to the live runtime exactly as the runtime's observer hands it a PyTorch op (its blocks,
written blocks, phase, iteration, duration; after its kernel was queued or before, as the runtime observes:
``RuntimeAdapter.hook_after_launch``), and the runtime's policy and mover act on it.
Frees reach the runtime before the launch that follows them, iteration ends after the iteration's last launch;
at each iteration end the host waits for the GPU (a training loop that reads its loss), so per-iteration times
are GPU times between events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

MB2 = 2 << 20  # the driver's VA block, the layout's block
CHUNK = 1 << 20  # most bytes one kernel chunk covers: a CTA's unit of work
READ, WRITE = 1, 2  # uvmprefetch.trace.format's access modes
TABLE_DTYPE = np.dtype([("addr", "<u8"), ("len", "<u4"), ("mode", "<u4")])  # struct Chunk in kernels/touch.cu


@dataclass
class TouchPlan:
    """Every launch's bytes as disjoint chunks of at most ``CHUNK`` bytes, in arena offsets.

    Launch ``i`` owns chunks ``ptr[i]:ptr[i+1]``; chunk ``j`` covers ``[off[j], off[j] + length[j])`` with mode
    ``mode[j]`` (READ, WRITE or both: the union of the modes of the accesses that name its bytes)."""

    ptr: np.ndarray
    off: np.ndarray
    length: np.ndarray
    mode: np.ndarray

    @property
    def n_chunks(self) -> int:
        return int(self.off.shape[0])

    def table(self, base: int) -> np.ndarray:
        """The chunk table the kernel reads (``TABLE_DTYPE``), with absolute addresses over an arena at ``base``."""
        t = np.empty(self.n_chunks, dtype=TABLE_DTYPE)
        t["addr"] = self.off.astype(np.uint64) + np.uint64(base)
        t["len"] = self.length
        t["mode"] = self.mode
        return t

    def launch_bytes(self) -> np.ndarray:
        """Bytes each launch touches (each byte once)."""
        csum = np.concatenate(([0], np.cumsum(self.length, dtype=np.int64)))
        return csum[self.ptr[1:]] - csum[self.ptr[:-1]]


def touch_plan(trace, base: np.ndarray, chunk: int = CHUNK) -> TouchPlan:
    """The ``TouchPlan`` of ``trace`` with allocation ``a`` at arena offset ``base[a]`` (a layout's ``base``).

    Per launch, a sweep over the starts and ends of its accesses: each elementary interval covered by at least
    one access keeps the union of their modes; neighbours with the same mode merge; the result is cut into
    chunks. Vectorised over all launches at once (launch ``i``'s positions are keyed ``i * span + offset``)."""
    L = trace.n_launches
    launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(trace.acc_ptr))
    start = np.asarray(base, dtype=np.int64)[trace.acc_alloc] + trace.acc_off
    end = start + trace.acc_len
    if not start.size:
        return TouchPlan(np.zeros(L + 1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint32),
                         np.zeros(0, np.uint32))
    span = int(end.max()) + 1
    if L * span >= 1 << 62:
        raise ValueError(f"trace too large for the touch plan's keys ({L} launches over {span} bytes)")
    keys = np.concatenate((launch_of * span + start, launch_of * span + end))
    r = ((trace.acc_mode & READ) != 0).astype(np.int64)
    w = ((trace.acc_mode & WRITE) != 0).astype(np.int64)
    dr, dw = np.concatenate((r, -r)), np.concatenate((w, -w))
    order = np.argsort(keys, kind="stable")
    keys, dr, dw = keys[order], dr[order], dw[order]
    first = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    pos = keys[first]
    cr = np.cumsum(np.add.reduceat(dr, first))[:-1]  # readers covering [pos[k], pos[k+1])
    cw = np.cumsum(np.add.reduceat(dw, first))[:-1]
    lid = pos[:-1] // span
    mode = np.where(cr > 0, READ, 0) | np.where(cw > 0, WRITE, 0)
    keep = (mode > 0) & (pos[1:] // span == lid)
    lo, hi, lid, mode = pos[:-1][keep] - lid[keep] * span, pos[1:][keep] - lid[keep] * span, lid[keep], mode[keep]
    # merge neighbours of one launch with the same mode
    joins = (lid[1:] == lid[:-1]) & (lo[1:] == hi[:-1]) & (mode[1:] == mode[:-1])
    heads = np.flatnonzero(np.concatenate(([True], ~joins)))
    tails = np.concatenate((heads[1:] - 1, [lo.size - 1]))
    lo, hi, lid, mode = lo[heads], hi[tails], lid[heads], mode[heads]
    # cut into chunks
    n = -(-(hi - lo) // chunk)
    total = int(n.sum())
    k = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    off = np.repeat(lo, n) + k * chunk
    length = np.minimum(off + chunk, np.repeat(hi, n)) - off
    clid = np.repeat(lid, n)
    ptr = np.searchsorted(clid, np.arange(L + 1)).astype(np.int64)
    return TouchPlan(ptr, off, length.astype(np.uint32), np.repeat(mode, n).astype(np.uint32))


SAMPLE_STRIDE = 1 << 16  # the data check reads one byte every 64 KiB of the arena


def last_stamps(plan: TouchPlan, samples: np.ndarray, launches: int) -> tuple[np.ndarray, np.ndarray]:
    """For arena offsets ``samples`` (sorted): the stamp the last of the first ``launches`` launches to write each
    one left there (the launch index, low 8 bits), and whether any wrote it."""
    want = np.zeros(samples.size, np.uint8)
    hit = np.zeros(samples.size, bool)
    w = np.flatnonzero((plan.mode[: plan.ptr[launches]] & WRITE) != 0)
    lo = np.searchsorted(samples, plan.off[w])
    hi = np.searchsorted(samples, plan.off[w] + plan.length[w])
    stamp = (np.searchsorted(plan.ptr, w, side="right") - 1) & 0xFF
    for a, b, s in zip(lo.tolist(), hi.tolist(), stamp.tolist()):  # in launch order: the last writer wins
        if b > a:
            want[a:b] = s
            hit[a:b] = True
    return want, hit


class Device:
    """What the replay needs of a GPU: a ``_evict_cuda.Cuda`` (memory, the compute stream, copies) and touch
    kernels launched on its stream. Subclasses: ``_replay_cuda.CudaDevice`` and ``_replay_fake.FakeDevice``.

    ``kind``: what the figures are (a GPU's, or the fake's model); ``runtime_env()``: what must hold while the
    live runtime runs (the fake installs itself at the CUDA boundary there); ``measured(backend_result)``: the
    faults and bytes each way the device could count (``None`` for each it could not)."""

    kind = "gpu"

    def __init__(self, cuda, kernels, name: str) -> None:
        self.cuda, self.kernels, self.name = cuda, kernels, name
        self.rt = cuda.rt

    def runtime_env(self):
        import contextlib
        return contextlib.nullcontext()

    def clock(self) -> float:
        """The host's clock in seconds, the one the GPU's timeline is measured against."""
        return time.perf_counter()

    def measured(self, backend_result: dict) -> dict:
        return {"faults": None, "bytes_htod": None, "bytes_dtoh": None, "measured_by": None}

    def event(self):
        return self.cuda.check(self.rt.cudaEventCreate(), "cudaEventCreate")

    def record(self, ev) -> None:
        self.cuda.check(self.rt.cudaEventRecord(ev, self.cuda.stream), "cudaEventRecord")

    def wait(self, ev) -> None:
        self.cuda.check(self.rt.cudaEventSynchronize(ev), "cudaEventSynchronize")

    def elapsed(self, a, b) -> float:
        return float(self.cuda.check(self.rt.cudaEventElapsedTime(a, b), "cudaEventElapsedTime")) / 1e3

    def destroy(self, ev) -> None:
        self.rt.cudaEventDestroy(ev)

    def read_bytes(self, base: int, offsets: np.ndarray) -> np.ndarray:
        """The bytes at ``base + offsets`` of managed memory, read from the host (the driver migrates their
        pages back)."""
        import ctypes
        view = np.ctypeslib.as_array((ctypes.c_uint8 * (int(offsets.max()) + 1)).from_address(int(base)))
        return view[offsets].copy()

    def upload(self, arr: np.ndarray) -> int:
        """A device copy of ``arr``'s bytes (freed with the device); waits for the copy."""
        n = max(int(arr.nbytes), 16)
        dev = self.cuda.device(n)
        host_ptr, host = self.cuda.pinned(n)
        host[: arr.nbytes] = np.frombuffer(arr.tobytes(), dtype=np.uint8)
        self.cuda.copy(dev, host_ptr, n)
        self.cuda.sync()
        return dev

    def download(self, ptr: int, nbytes: int) -> np.ndarray:
        host_ptr, host = self.cuda.pinned(nbytes)
        self.cuda.copy(host_ptr, ptr, nbytes)
        self.cuda.sync()
        return host.copy()


def self_test(dev: Device) -> tuple[bool, str]:
    """The touch kernel's counting variant over chunks with unaligned heads and tails, chunks shorter than 16
    bytes and every mode, in device memory: every byte of every chunk visited exactly once, no byte outside, and
    the written bytes hold the stamp. Returns (ok, what was found)."""
    n = 1 << 16
    buf = dev.cuda.device(n)
    dev.cuda.memset(buf, 0, n)
    counts = dev.cuda.device(4 * n)
    dev.cuda.memset(counts, 0, 4 * n)
    spans = [(3, 1), (5, 10), (17, 16), (100, 900), (1024, 4096), (6000, 33), (8191, 20001), (40000, 1)]
    modes = [READ, WRITE, READ | WRITE, WRITE, READ, READ | WRITE, WRITE, WRITE]
    t = np.zeros(len(spans), dtype=TABLE_DTYPE)
    t["addr"] = [buf + o for o, _ in spans]
    t["len"] = [ln for _, ln in spans]
    t["mode"] = modes
    table = dev.upload(t)
    dev.kernels.touch_count(table, 0, len(spans), 0, 0xA5, counts, buf)
    dev.cuda.sync()
    got = dev.download(counts, 4 * n).view(np.uint32)
    data = dev.download(buf, n)
    want = np.zeros(n, np.uint32)
    stamped = np.zeros(n, bool)
    for (o, ln), m in zip(spans, modes):
        want[o:o + ln] += 1
        stamped[o:o + ln] |= bool(m & WRITE)
    bad = np.flatnonzero(got != want)
    if bad.size:
        return False, f"byte {bad[0]} visited {got[bad[0]]} times, expected {want[bad[0]]} ({bad.size} bytes wrong)"
    wrong = np.flatnonzero((data == 0xA5) != stamped)
    if wrong.size:
        return False, f"byte {wrong[0]}: written {bool(data[wrong[0]] == 0xA5)}, expected {bool(stamped[wrong[0]])}"
    return True, f"{len(spans)} chunks, {int(want.sum())} bytes each visited once, {int(stamped.sum())} written"


@dataclass
class Run:
    """One replay on a device: the trace (scaled), its layout and plan, the durations the kernels spin to."""

    trace: object
    layout: object
    plan: TouchPlan
    durations: np.ndarray  # seconds per launch (the simulator's, for the profile)
    spin_s: np.ndarray  # what each kernel spins to: the duration less the profile's launch overhead
    budget_bytes: int
    policy: str
    hook_after_launch: bool = True  # the runtime sees each launch after its kernel was queued (RuntimeAdapter)

    @property
    def arena_bytes(self) -> int:
        return int(self.layout.max_blocks) * MB2

    @property
    def table_bytes(self) -> int:
        return self.plan.n_chunks * TABLE_DTYPE.itemsize


def replay_on_device(dev: Device, run: Run, runtime_factory, deadline: float) -> dict:
    """Replay ``run`` on ``dev`` under the live runtime that ``runtime_factory(dev, arena, arena_bytes, budget,
    policy, hook_after_launch)`` builds (``_replay_runtime.RuntimeAdapter``); stop launching at
    ``time.monotonic() > deadline``.
    Returns the measured figures (the replay JSON fields a GPU can give) and the runtime's own report."""
    mark = dev.cuda.mark()
    try:
        return _replay(dev, run, runtime_factory, deadline)
    finally:
        dev.cuda.free_since(mark)  # the arena, the chunk table and its staging buffer


def _replay(dev: Device, run: Run, runtime_factory, deadline: float) -> dict:
    t, lay, plan = run.trace, run.layout, run.plan
    cuda = dev.cuda
    raw = cuda.managed(run.arena_bytes + MB2)
    base = -(-raw // MB2) * MB2  # layout block b = the arena's block b
    t0 = time.perf_counter()
    # The arena starts on the host, as the simulator assumes (a block's first touch is a fault that brings it
    # over the link): a prefetch to the host populates it there.
    cuda.prefetch(base, run.arena_bytes, to_gpu=False)
    cuda.sync()
    table = dev.upload(plan.table(base))
    setup_s = time.perf_counter() - t0
    spin_ns = np.round(run.spin_s * 1e9).astype(np.int64).tolist()
    ptr = plan.ptr.tolist()
    its = t.launch_iter.tolist()
    lptr, wptr, dptr = lay.ptr.tolist(), lay.wptr.tolist(), lay.dptr.tolist()
    blocks, wblocks, dead = lay.blocks, lay.write_blocks, lay.dead_blocks
    exec_ids, names, phases = t.launch_exec_id.tolist(), t.launch_name.tolist(), t.launch_phase.tolist()
    durs = np.asarray(run.durations, dtype=np.float64).tolist()
    touch = dev.kernels.touch
    with dev.runtime_env():
        rt = runtime_factory(dev, base, run.arena_bytes, run.budget_bytes, run.policy, run.hook_after_launch)
        after = rt.hook_after_launch  # the runtime sees a launch after its kernel was queued, or before
        events = [dev.event()]
        iter_ends: list[int] = []
        waited = 0.0
        cut = False
        launched = 0

        def end_iteration(k: int) -> float:
            ev = dev.event()
            dev.record(ev)
            events.append(ev)
            w0 = dev.clock()
            dev.wait(ev)  # the host waits for the GPU, as a loop that reads its loss does
            w = dev.clock() - w0
            rt.end_iteration(k)
            iter_ends.append(k)
            return w

        try:
            dev.record(events[0])
            w0 = dev.clock()
            L = t.n_launches
            for i in range(L):
                if i and its[i] != its[i - 1] and its[i - 1] >= 0:
                    waited += end_iteration(its[i - 1])
                if dptr[i + 1] > dptr[i]:
                    rt.free(dead[dptr[i]:dptr[i + 1]])
                if after:
                    touch(table, ptr[i], ptr[i + 1] - ptr[i], spin_ns[i], i & 0xFF)
                rt.launch(i, exec_ids[i], names[i], phases[i], its[i], durs[i], blocks[lptr[i]:lptr[i + 1]],
                          wblocks[wptr[i]:wptr[i + 1]])
                if not after:
                    touch(table, ptr[i], ptr[i + 1] - ptr[i], spin_ns[i], i & 0xFF)
                launched = i + 1
                if (i & 63) == 63 and time.monotonic() > deadline:
                    cut = i + 1 < L
                    break
            if not cut:
                if L and its[-1] >= 0:
                    waited += end_iteration(its[-1])
                if dptr[L + 1] > dptr[L]:
                    rt.free(dead[dptr[L]:dptr[L + 1]])
            last = dev.event()
            dev.record(last)
            events.append(last)
            dev.wait(last)
            loop_s = dev.clock() - w0
            gpu_s = dev.elapsed(events[0], last)
            iter_s = [dev.elapsed(a, b) for a, b in zip(events[:len(iter_ends)], events[1:len(iter_ends) + 1])]
            backend = rt.result()
        finally:
            rt.close()
            for ev in events:
                dev.destroy(ev)
    data = check_data(dev, plan, base, run.arena_bytes, launched)  # (the runtime's moves have all finished)
    ideal = float(np.sum(durs[:launched]))
    host = backend.get("host_time") or {}
    stages = host.get("total_s") or {}
    host_loop = loop_s - waited
    out = {"time_s": gpu_s, "ideal_s": ideal, "slowdown": gpu_s / ideal if ideal > 0 else None,
           "stall_s": gpu_s - ideal, "iteration_times_s": iter_s, "iterations": len(iter_s),
           "launches": launched, "cut": bool(cut), "wall_s": loop_s, "setup_s": setup_s,
           "host_loop_s": host_loop, "host_wait_s": waited,
           "host_us_per_launch": host_loop / launched * 1e6 if launched else None,
           # the host per launch outside what the simulator's host clock charges on its own (the policy's
           # decision, measured there; evictions that hold the thread): its ``launch_s``
           "host_launch_s": max(0.0, host_loop - sum(stages.get(k, 0.0) for k in ("policy", "evict", "discard")))
           / launched if launched else 0.0,
           "events_per_s": launched / loop_s if loop_s > 0 else None,
           "arena_base": base, "arena_bytes": run.arena_bytes, "table_bytes": run.table_bytes,
           "budget_bytes": run.budget_bytes, "data": data}
    out.update(dev.measured(backend))
    for k in ("prefetch_issued_bytes", "prefetch_useful_bytes", "accuracy", "coverage", "expected_faults",
              "budget_evictions", "policy_evictions", "over_budget_launches", "footprint_bytes", "oversub",
              "capacity_blocks", "peak_resident_bytes"):
        out[k] = backend.get(k)
    out["books_bytes_htod"], out["books_bytes_dtoh"] = backend.get("bytes_htod"), backend.get("bytes_dtoh")
    out["runtime"] = {k: backend.get(k) for k in ("host_time", "mover", "cuda_calls", "cupti_status", "gpu",
                                                  "driver_version", "discards_issued")}
    return out


def check_data(dev: Device, plan: TouchPlan, base: int, arena_bytes: int, launches: int) -> dict:
    """Did every written byte keep what its last writer wrote, through every move the runtime made? One byte
    every ``SAMPLE_STRIDE`` of the arena, read back from the host after the replay."""
    samples = np.arange(7, arena_bytes, SAMPLE_STRIDE, dtype=np.int64)
    want, hit = last_stamps(plan, samples, launches)
    if not hit.any():
        return {"checked": 0, "wrong": 0, "first_wrong": None}
    got = dev.read_bytes(base, samples[hit])
    bad = np.flatnonzero(got != want[hit])
    return {"checked": int(hit.sum()), "wrong": int(bad.size),
            "first_wrong": None if not bad.size else {"offset": int(samples[hit][bad[0]]), "got": int(got[bad[0]]),
                                                      "want": int(want[hit][bad[0]])}}
