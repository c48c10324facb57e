"""Eviction paths measured: copy-out + discard + copy-in beside UVM's own eviction, and remote access (issue 33).

Measures, on the GPU it runs on, with cuda-python (``cuda.bindings.runtime``, ``_evict_cuda.py``), one part
after another, each under its own time limit:

1. ``copy_out``: ``cudaMemcpyAsync`` from GPU-resident managed memory into pinned host memory (GB/s at 2 MiB,
   64 MiB, 1 GiB), beside the same copy from a plain device buffer (the link's ceiling) and the copy back into
   GPU-resident managed memory;
2. ``discard``: ``cudaMemDiscardBatchAsync`` per call and per 2 MiB block (K blocks as K ranges and as one
   range, K = 1..256), whether ``cudaMemGetInfo`` sees a discarded range freed (and an evicted one), what
   evicting a discarded range costs against evicting live data, and whether a discard queued right behind a
   copy-out holds its caller until the copy is done;
3. ``copy_in``: the copy path's whole round trip: copy-out into the pinned mirror, discard, repopulate on the
   GPU without a copy (``cudaMemPrefetchAsync`` to the GPU, or ``cudaMemDiscardAndPrefetchBatchAsync``), copy
   back from the mirror; the data that comes back is checked bit for bit;
4. ``uvm``: the same round trip through UVM (``cudaMemPrefetchAsync`` to the host and back), checked bit for bit;
5. ``remote``: read and write bandwidth of a kernel (CuPy ``RawModule``, else torch) over a range whose
   preferred location is the host and which is mapped for the GPU (zero-copy), against the same kernels on
   GPU-resident memory.

Every figure is the median over repetitions of both the GPU time (events before and after the call) and the
time the call held the calling thread. Everything the script allocates on the GPU (a managed arena, a plain
device buffer of the same size, a few bytes for the kernel) stays under ``--max-fraction`` of the memory free
at start (docs/design.md §5); sizes above that are skipped and reported. A part whose call the driver lacks is
skipped with the reason. Results: a table printed last, ``evict_microbench.json``, and ``microbench`` entries
in ``bench/baselines/gpu.json``. ``--dry-run`` runs the same code over a fake CUDA driver (``_evict_fake.py``)
and checks that its arithmetic gives the fake's known costs back.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import _common as C
import baseline
from _evict_cuda import MB2, Cuda, CudaError, load_kernels
from calibrate import fit_line

NAME = "evict_microbench"
EPILOG = """\
examples:
  python bench/gpu/evict_microbench.py                    # about a minute on an H100 (limit: --time-limit 280)
  python bench/gpu/evict_microbench.py --sizes 2MiB,256MiB --reps 9 --no-baseline
  python bench/gpu/evict_microbench.py --dry-run           # fake CUDA driver on the CPU; checks the arithmetic

--reps counts repetitions at sizes over 128 MiB; sizes up to 128 MiB get twice as many, up to 8 MiB four times.
"""

DISCARD_BLOCKS = (1, 4, 16, 64, 256)  # K: blocks per discard call
REMOTE_BYTES = 256 << 20  # the remote-access range (capped by the arena)
WRITE_VALUE = 0x5A5A5A5A
# Each part's time limit in seconds (the whole script also stops at --time-limit). The next GPU session's
# first command is this script: ~1 min on an H100, at most ~4.5 min.
PART_LIMITS = {"copy_out": 40.0, "discard": 50.0, "copy_in": 60.0, "uvm": 60.0, "remote": 45.0}


class Skip(Exception):
    """A part that cannot run here (the reason is reported)."""


class Deadline:
    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds
        self.cut = False

    def over(self) -> bool:
        self.cut = self.cut or time.perf_counter() > self.end
        return self.cut


def pattern(nbytes: int) -> np.ndarray:
    """Bytes whose every 8-byte word differs (index times an odd constant is a bijection mod 2^64): a block
    copied to the wrong place, or not at all, cannot compare equal."""
    w = np.arange(nbytes // 8, dtype=np.uint64)
    w *= np.uint64(0x9E3779B97F4A7C15)
    w ^= np.uint64(0x5DEECE66D)
    return w.view(np.uint8)


# ---------------------------------------------------------------------------------------------- the buffers

class Bench:
    """The managed arena (2 MiB aligned, so that N blocks are N driver VA blocks), a device buffer of the same
    size, and three pinned host buffers: ``ref`` (the data), ``mirror`` (the copy path's host copy), ``check``
    (what a verification reads back)."""

    def __init__(self, cuda: Cuda, sizes: list[int], arena: int, reps: int, kernels, log):
        self.cuda, self.sizes, self.n, self.reps, self.kernels, self.log = cuda, sizes, arena, reps, kernels, log
        free0, _ = cuda.mem_get_info()
        raw = cuda.managed(arena + MB2)
        self.arena = (raw + MB2 - 1) // MB2 * MB2
        self.devbuf = cuda.device(arena)
        self.ref, self.ref_v = cuda.pinned(arena)
        self.mirror, self.mirror_v = cuda.pinned(arena)
        self.check, self.check_v = cuda.pinned(arena)
        self.ref_v[:] = pattern(arena)
        free1, _ = cuda.mem_get_info()
        self.reset(arena)  # first touch: the arena is populated on the GPU with the data
        free2, _ = cuda.mem_get_info()
        # does cudaMemGetInfo count managed memory the GPU holds? (if not, it cannot say whether a discard frees it)
        self.populate_seen = (free1 - free2) / arena
        self.setup_drop = free0 - free2  # what the buffers took from the free memory, as the driver reports it

    def reps_for(self, n: int) -> int:
        return self.reps * (4 if n <= (8 << 20) else 2 if n <= (128 << 20) else 1)

    def reset(self, n: int) -> None:
        """arena[:n] = ref[:n], resident on the GPU (a prefetch first: after a discard it copies nothing)."""
        self.cuda.prefetch(self.arena, n, True)
        self.cuda.copy(self.arena, self.ref, n)
        self.cuda.sync()

    def verify(self, n: int, expect: np.ndarray) -> bool:
        """Read arena[:n] back into the (first zeroed) check buffer and compare it with ``expect`` byte for byte."""
        self.check_v[:n] = 0
        self.cuda.copy(self.check, self.arena, n)
        self.cuda.sync()
        return bool(np.array_equal(self.check_v[:n], expect[:n]))

    def repeat(self, n: int, dl: Deadline, fn, reps: int | None = None) -> list[tuple[float, float]]:
        out = []
        for _ in range(reps or self.reps_for(n)):
            if dl.over():
                break
            out.append(self.cuda.timed(fn))
        return out


def med(samples, i: int) -> float | None:
    return statistics.median(s[i] for s in samples) if samples else None


def timing(samples) -> dict:
    """Medians of (host, GPU) samples in microseconds."""
    h, g = med(samples, 0), med(samples, 1)
    return {"gpu_us": None if g is None else g * 1e6, "host_us": None if h is None else h * 1e6, "reps": len(samples)}


def gbps(nbytes: float, seconds: float | None) -> float | None:
    return nbytes / seconds / 1e9 if seconds else None


def point(n: int, samples, **extra) -> dict:
    g = med(samples, 1)
    return {"size_bytes": n, "gb_s": gbps(n, g), **timing(samples), **extra}


# ------------------------------------------------------------------------------------------------ the parts

def part_copy_out(b: Bench, dl: Deadline) -> dict:
    cu = b.cuda
    out: dict = {"managed_to_pinned": [], "device_to_pinned": [], "pinned_to_managed": []}
    for n in b.sizes:
        if dl.over():
            break
        b.reset(n)
        b.mirror_v[:n] = 0
        s = b.repeat(n, dl, lambda: cu.copy(b.mirror, b.arena, n))
        if not s:
            break
        out["managed_to_pinned"].append(point(n, s, bit_exact=bool(np.array_equal(b.mirror_v[:n], b.ref_v[:n]))))
        cu.copy(b.devbuf, b.ref, n)
        cu.sync()
        out["device_to_pinned"].append(point(n, b.repeat(n, dl, lambda: cu.copy(b.mirror, b.devbuf, n))))
        # into GPU-resident managed memory: the copy-in's copy alone (the mirror holds ref's bytes again)
        out["pinned_to_managed"].append(point(n, b.repeat(n, dl, lambda: cu.copy(b.arena, b.mirror, n))))
    return out


def line_fit(points: list[dict]) -> dict:
    """Per call and per block (intercept and slope of time against blocks), GPU and host, in microseconds."""
    if len(points) < 2:
        return {}
    ks = [float(p["blocks"]) for p in points]
    out = {}
    for key, label in (("gpu_us", ""), ("host_us", "host_")):
        icpt, slope, _ = fit_line(ks, [p[key] for p in points])
        out[f"{label}per_call_us"], out[f"{label}per_block_us"] = icpt, slope
    return out


def verdict(fraction: float | None) -> str:
    if fraction is None:
        return "not measured"
    return "yes" if fraction >= 0.9 else "no" if fraction <= 0.1 else f"partly ({fraction:.0%})"


def mem_get_info_probe(b: Bench, dl: Deadline) -> dict:
    """Does cudaMemGetInfo see a discard (or an eviction) free the GPU memory? And what does evicting a
    discarded range cost against evicting live data? Three rounds on the whole arena, medians."""
    cu, n = b.cuda, b.n
    rows, t_disc, t_ev_disc, t_ev = [], [], [], []
    free = lambda: cu.mem_get_info()[0]  # noqa: E731
    for _ in range(3):
        if dl.over():
            break
        b.reset(n)
        f1 = free()
        t_disc.append(cu.timed(lambda: cu.discard([(b.arena, n)])))
        f2 = free()
        t_ev_disc.append(cu.timed(lambda: cu.prefetch(b.arena, n, False)))
        f3 = free()
        b.reset(n)
        f4 = free()
        t_ev.append(cu.timed(lambda: cu.prefetch(b.arena, n, False)))
        f5 = free()
        rows.append({"discard": (f2 - f1) / n, "evict_discarded": (f3 - f1) / n, "evict": (f5 - f4) / n})
    frac = {k: statistics.median(r[k] for r in rows) if rows else None for k in ("discard", "evict_discarded", "evict")}
    return {"bytes": n, "populate_seen_fraction": b.populate_seen,
            "discard_freed_fraction": frac["discard"], "discard_frees_memory": verdict(frac["discard"]),
            "evict_after_discard_freed_fraction": frac["evict_discarded"], "evict_freed_fraction": frac["evict"],
            "discard_whole_range": point(n, t_disc), "evict_after_discard": point(n, t_ev_disc),
            "evict_live": point(n, t_ev), "rounds": rows}


def discard_behind_copy(b: Bench, dl: Deadline) -> dict:
    """The copy path queues a discard right behind its copy-out: does that call hold the caller until the copy
    is done (then a mover thread must issue it), or only for the discard itself? Three rounds on the arena."""
    cu, n = b.cuda, b.n
    copy, behind = [], []
    for _ in range(3):
        if dl.over():
            break
        b.reset(n)
        copy.append(cu.timed(lambda: cu.copy(b.mirror, b.arena, n)))
        b.reset(n)
        cu.copy(b.mirror, b.arena, n)  # still running when the discard is issued
        behind.append(cu.timed(lambda: cu.discard([(b.arena, n)])))
    held, copy_gpu = med(behind, 0), med(copy, 1)
    return {"bytes": n, "copy": point(n, copy), "discard": timing(behind),
            "waits_for_copy": None if held is None or copy_gpu is None else held > 0.5 * copy_gpu}


def part_discard(b: Bench, dl: Deadline) -> dict:
    cu = b.cuda
    if not cu.has("cudaMemDiscardBatchAsync"):
        raise Skip("cudaMemDiscardBatchAsync is not in this cuda-python (CUDA 13 bindings needed)")
    ks = [k for k in DISCARD_BLOCKS if k * MB2 <= b.n]
    out: dict = {}
    for variant in ("ranges", "one_range"):
        pts = []
        for k in ks:
            if dl.over():
                break
            ranges = [(b.arena + i * MB2, MB2) for i in range(k)] if variant == "ranges" else [(b.arena, k * MB2)]
            samples = []
            for _ in range(2 * b.reps):
                if dl.over():
                    break
                cu.prefetch(b.arena, k * MB2, True)  # resident again: discarding discarded pages does nothing
                cu.sync()
                samples.append(cu.timed(lambda: cu.discard(ranges)))
            if samples:
                pts.append({"blocks": k, **timing(samples)})
        out[variant] = {"points": pts, **line_fit(pts)}
    out["mem_get_info"] = mem_get_info_probe(b, dl)
    out["behind_copy"] = discard_behind_copy(b, dl)
    return out


COPY_IN_VARIANTS = (("prefetch", "cudaMemPrefetchAsync"), ("discard_and_prefetch", "cudaMemDiscardAndPrefetchBatchAsync"))


def copy_round_trips(b: Bench, dl: Deadline, variant: str) -> list[dict]:
    """Copy-out, discard, repopulate (``variant``), copy-in, per size. Between the discard and the copy-in the
    mirror's bits are flipped on the host, so the data that must come back differs from anything the GPU
    pages could still hold: the check fails unless the copy-in landed and nothing overwrote it before the
    read-back."""
    cu = b.cuda
    pts = []
    for n in b.sizes:
        steps: dict = {"copy_out": [], "discard": [], "repopulate": [], "copy_in": []}
        out_exact, in_exact = [], []
        for _ in range(b.reps_for(n)):
            if dl.over():
                break
            b.reset(n)
            b.mirror_v[:n] = 0
            steps["copy_out"].append(cu.timed(lambda: cu.copy(b.mirror, b.arena, n)))
            out_exact.append(bool(np.array_equal(b.mirror_v[:n], b.ref_v[:n])))
            steps["discard"].append(cu.timed(lambda: cu.discard([(b.arena, n)])))
            np.bitwise_not(b.mirror_v[:n], out=b.mirror_v[:n])
            if variant == "prefetch":
                steps["repopulate"].append(cu.timed(lambda: cu.prefetch(b.arena, n, True)))
            else:
                steps["repopulate"].append(cu.timed(lambda: cu.discard_prefetch([(b.arena, n)])))
            steps["copy_in"].append(cu.timed(lambda: cu.copy(b.arena, b.mirror, n)))
            in_exact.append(b.verify(n, b.mirror_v))
        if not in_exact:
            break
        st = {k: timing(v) for k, v in steps.items()}
        g = {k: med(v, 1) for k, v in steps.items()}
        pts.append({"size_bytes": n, **st, "copy_out_bit_exact": all(out_exact), "bit_exact": all(in_exact),
                    "evict_gb_s": gbps(n, g["copy_out"] + g["discard"]),
                    "restore_gb_s": gbps(n, g["repopulate"] + g["copy_in"]),
                    "round_trip_gb_s": gbps(2 * n, sum(g.values())),
                    "host_us": sum(v["host_us"] for v in st.values())})
    return pts


def part_copy_in(b: Bench, dl: Deadline) -> dict:
    cu = b.cuda
    if not cu.has("cudaMemDiscardBatchAsync"):
        raise Skip("cudaMemDiscardBatchAsync is not in this cuda-python (CUDA 13 bindings needed)")
    out = {}
    for variant, call in COPY_IN_VARIANTS:
        if not cu.has(call):
            out[variant] = {"skipped": f"{call} is not in this cuda-python"}
            continue
        try:
            out[variant] = {"points": copy_round_trips(b, dl, variant)}
        except CudaError as e:
            if not e.unsupported:
                raise
            out[variant] = {"skipped": str(e)}
    if all("skipped" in v for v in out.values()):  # (a variant cut by the time limit is a cut part, not a skip)
        raise Skip("; ".join(f"{k}: {v.get('skipped', 'nothing measured')}" for k, v in out.items()))
    return out


def part_uvm(b: Bench, dl: Deadline) -> dict:
    cu = b.cuda
    pts = []
    for n in b.sizes:
        to_host, to_gpu, exact = [], [], []
        for _ in range(b.reps_for(n)):
            if dl.over():
                break
            b.reset(n)
            to_host.append(cu.timed(lambda: cu.prefetch(b.arena, n, False)))
            to_gpu.append(cu.timed(lambda: cu.prefetch(b.arena, n, True)))
            exact.append(b.verify(n, b.ref_v))
        if not exact:
            break
        gh, gg = med(to_host, 1), med(to_gpu, 1)
        pts.append({"size_bytes": n, "to_host": point(n, to_host), "to_gpu": point(n, to_gpu),
                    "round_trip_gb_s": gbps(2 * n, gh + gg), "bit_exact": all(exact)})
    return {"points": pts}


def part_remote(b: Bench, dl: Deadline) -> dict:
    cu = b.cuda
    kern, notes = b.kernels(cu)
    if kern is None:
        raise Skip("no kernel could be loaded: " + "; ".join(notes))
    n = min(b.n, REMOTE_BYTES)
    reps = max(3, b.reps)
    out: dict = {"kernel": kern.name, "kernel_notes": notes, "bytes": n}
    expected = kern.expected(b.ref_v[:n])

    def reads() -> tuple[list, bool]:
        samples, ok = [], True
        for _ in range(reps):
            if dl.over():
                break
            samples.append(cu.timed(lambda: kern.read(b.arena, n)))
            got = kern.checksum()  # every time: it also zeroes the accumulator for the next read
            ok = ok and got == expected
        return samples, ok

    b.reset(n)
    kern.read(b.arena, n)  # warm-up: compiles and loads the kernel
    kern.checksum()
    local, local_ok = reads()
    cu.prefer_host(b.arena, n, True)
    try:
        cu.prefetch(b.arena, n, False)
        cu.sync()
        remote, remote_ok = reads()
        writes = b.repeat(n, dl, lambda: kern.write(b.arena, n, WRITE_VALUE), reps)
        b.check_v[:n] = 0
        cu.copy(b.check, b.arena, n)
        cu.sync()
        write_ok = bool((b.check_v[:n].view(np.uint32) == WRITE_VALUE).all())
    finally:
        cu.prefer_host(b.arena, n, False)
    b.reset(n)
    local_writes = b.repeat(n, dl, lambda: kern.write(b.arena, n, WRITE_VALUE), reps)
    later = remote[1:] or remote
    local_gb = gbps(n, med(local, 1))
    read_gb = gbps(n, med(later, 1))
    out.update(local_read=point(n, local), local_write=point(n, local_writes),
               read_first_pass=point(n, remote[:1]), read=point(n, later), write=point(n, writes),
               read_checksum_ok=local_ok and remote_ok, write_ok=write_ok,
               # a read that had migrated the range would run at local speed from the second pass on
               stayed_remote=None if not (local_gb and read_gb) else read_gb < 0.5 * local_gb)
    return out


PARTS = [("copy_out", part_copy_out), ("discard", part_discard), ("copy_in", part_copy_in), ("uvm", part_uvm),
         ("remote", part_remote)]


def run_parts(b: Bench, time_limit: float, log) -> dict:
    t_end = time.perf_counter() + time_limit
    results = {}
    for name, fn in PARTS:
        left = t_end - time.perf_counter()
        if left <= 0:
            results[name] = {"status": "cut", "reason": f"--time-limit {time_limit:g} s reached before it started"}
            continue
        dl = Deadline(min(PART_LIMITS[name], left))
        t0 = time.perf_counter()
        try:
            res, status = fn(b, dl), None
        except Skip as e:
            res, status = {"reason": str(e)}, "skipped"
        except CudaError as e:
            res, status = {"reason": str(e)}, "skipped" if e.unsupported else "error"
        except Exception as e:  # noqa: BLE001 - a kernel library's error must not cost the other parts' results
            res, status = {"reason": f"{type(e).__name__}: {str(e)[:300]}"}, "error"
        res["status"] = status or ("cut" if dl.cut else "ok")
        res["elapsed_s"] = time.perf_counter() - t0
        log(f"{name}: {res['status']} in {res['elapsed_s']:.1f} s" + (f" ({res['reason']})" if "reason" in res else ""))
        results[name] = res
    return results


# ------------------------------------------------------------------------------------------ report and checks

def size_label(n: int) -> str:
    return f"{n >> 30} GiB" if n >= (1 << 30) and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def clean(obj):
    """JSON-safe: NumPy scalars to Python, non-finite floats to None (a figure not measured is null)."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def _us(v) -> str:
    return "-" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _gb(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def largest(points: list[dict]) -> dict | None:
    return max(points, key=lambda p: p["size_bytes"]) if points else None


def summary(parts: dict) -> dict:
    """The figures that decide the design, at the largest size every path measured."""
    co, cin, uvm, rem = (parts.get(k, {}) for k in ("copy_out", "copy_in", "uvm", "remote"))
    disc = parts.get("discard", {})
    out = {"copy_out_gb_s": None, "uvm_evict_gb_s": None, "copy_round_trip_gb_s": None, "uvm_round_trip_gb_s": None,
           "copy_over_uvm_round_trip": None, "size_bytes": None,
           "discard_per_call_us": disc.get("ranges", {}).get("per_call_us"),
           "discard_per_block_us": disc.get("ranges", {}).get("per_block_us"),
           "discard_frees_memory": disc.get("mem_get_info", {}).get("discard_frees_memory"),
           "discard_waits_for_copy": disc.get("behind_copy", {}).get("waits_for_copy"),
           "remote_read_gb_s": (rem.get("read") or {}).get("gb_s"),
           "remote_write_gb_s": (rem.get("write") or {}).get("gb_s")}
    trips = cin.get("prefetch", {}).get("points") or cin.get("discard_and_prefetch", {}).get("points") or []
    common = {p["size_bytes"] for p in trips} & {p["size_bytes"] for p in uvm.get("points", [])}
    if common:
        n = max(common)
        cp = next(p for p in trips if p["size_bytes"] == n)
        up = next(p for p in uvm["points"] if p["size_bytes"] == n)
        out.update(size_bytes=n, copy_round_trip_gb_s=cp["round_trip_gb_s"], uvm_round_trip_gb_s=up["round_trip_gb_s"],
                   uvm_evict_gb_s=up["to_host"]["gb_s"])
        if cp["round_trip_gb_s"] and up["round_trip_gb_s"]:
            out["copy_over_uvm_round_trip"] = cp["round_trip_gb_s"] / up["round_trip_gb_s"]
    big = largest(co.get("managed_to_pinned", []))
    out["copy_out_gb_s"] = big and big["gb_s"]
    return out


def table_rows(parts: dict, memory: dict) -> list[list]:
    mem = memory
    rows: list[list] = [["all", "GPU memory the script allocates", size_label(mem["gpu_bytes_allocated"] - MB2), "-", "-",
                         "-", f"<= {mem['max_fraction']:g} x {mem['free_bytes'] / 2**30:.1f} GiB free "
                         f"(measured drop {mem['free_drop_after_setup_bytes'] / 2**20:.0f} MiB)"]]
    co = parts["copy_out"]
    for key, what in (("managed_to_pinned", "D2H GPU-resident managed -> pinned (copy-out)"),
                      ("device_to_pinned", "D2H cudaMalloc -> pinned (link ceiling)"),
                      ("pinned_to_managed", "H2D pinned -> GPU-resident managed (copy-in's copy)")):
        for p in co.get(key, []):
            rows.append(["copy_out", what, size_label(p["size_bytes"]), _gb(p["gb_s"]), _us(p["gpu_us"]),
                         _us(p["host_us"]), "" if p.get("bit_exact", True) else "DATA DIFFERS"])
    d = parts["discard"]
    for variant, what in (("ranges", "K ranges of 2 MiB"), ("one_range", "one range of K x 2 MiB")):
        v = d.get(variant, {})
        if "per_call_us" in v:
            rows.append(["discard", f"per call, {what}", "-", "-", _us(v["per_call_us"]), _us(v["host_per_call_us"]),
                         f"K = {', '.join(str(p['blocks']) for p in v['points'])}"])
            rows.append(["discard", f"per 2 MiB block, {what}", "-", "-", _us(v["per_block_us"]),
                         _us(v["host_per_block_us"]), ""])
    m = d.get("mem_get_info")
    if m:
        n = size_label(m["bytes"])
        rows.append(["discard", "cudaMemGetInfo sees discarded memory freed", n, "-", "-", "-",
                     f"{m['discard_frees_memory']} (after populate it saw {m['populate_seen_fraction']:.0%}; after "
                     f"an eviction {m['evict_freed_fraction'] if m['evict_freed_fraction'] is None else format(m['evict_freed_fraction'], '.0%')})"])
        for key, what in (("evict_after_discard", "prefetch to host of a discarded range"),
                          ("evict_live", "prefetch to host of live data (UVM eviction)")):
            p = m[key]
            rows.append(["discard", what, n, _gb(p["gb_s"]), _us(p["gpu_us"]), _us(p["host_us"]), ""])
    q = d.get("behind_copy")
    if q and q["discard"]["reps"]:
        rows.append(["discard", "discard issued right behind a copy-out of the range", size_label(q["bytes"]), "-",
                     _us(q["discard"]["gpu_us"]), _us(q["discard"]["host_us"]),
                     f"copy {_us(q['copy']['gpu_us'])} us; the call waits for the copy: {q['waits_for_copy']}"])
    for variant, what in (("prefetch", "prefetch to GPU"), ("discard_and_prefetch", "DiscardAndPrefetchBatch")):
        v = parts["copy_in"].get(variant, {})
        if "skipped" in v:
            rows.append(["copy_in", f"round trip, repopulate by {what}", "-", "-", "-", "-", f"skipped: {v['skipped']}"])
        for p in v.get("points", []):
            g = sum(p[k]["gpu_us"] for k in ("copy_out", "discard", "repopulate", "copy_in"))
            steps = ", ".join(f"{k} {_us(p[k]['gpu_us'])}" for k in ("copy_out", "discard", "repopulate", "copy_in"))
            rows.append(["copy_in", f"round trip, repopulate by {what}", size_label(p["size_bytes"]),
                         _gb(p["round_trip_gb_s"]), _us(g), _us(p["host_us"]),
                         f"{'bit-exact' if p['bit_exact'] else 'DATA DIFFERS'}; us: {steps}"])
    for p in parts["uvm"].get("points", []):
        n = size_label(p["size_bytes"])
        rows.append(["uvm", "prefetch to host (eviction)", n, _gb(p["to_host"]["gb_s"]), _us(p["to_host"]["gpu_us"]),
                     _us(p["to_host"]["host_us"]), ""])
        rows.append(["uvm", "prefetch to GPU", n, _gb(p["to_gpu"]["gb_s"]), _us(p["to_gpu"]["gpu_us"]),
                     _us(p["to_gpu"]["host_us"]), ""])
        rows.append(["uvm", "round trip", n, _gb(p["round_trip_gb_s"]), "-", "-",
                     "bit-exact" if p["bit_exact"] else "DATA DIFFERS"])
    r = parts["remote"]
    if "read" in r:
        n = size_label(r["bytes"])
        for key, what in (("read", "remote read (preferred host, mapped)"), ("write", "remote write"),
                          ("read_first_pass", "remote read, first pass"), ("local_read", "same read, GPU-resident"),
                          ("local_write", "same write, GPU-resident")):
            p = r[key]
            rows.append(["remote", what, n, _gb(p["gb_s"]), _us(p["gpu_us"]), _us(p["host_us"]), r["kernel"]])
    for name, res in parts.items():
        if res["status"] != "ok":
            rows.append([name, f"part {res['status']}", "-", "-", "-", "-", res.get("reason", "time limit")])
    for n in mem["sizes_over_cap"]:
        rows.append(["all", "size skipped", size_label(n), "-", "-", "-", f"over the cap of {size_label(mem['cap_bytes'])}"])
    s = summary(parts)
    if s["copy_over_uvm_round_trip"] is not None:
        rows.append(["summary", "copy path round trip / UVM round trip", size_label(s["size_bytes"]),
                     f"{_gb(s['copy_round_trip_gb_s'])} / {_gb(s['uvm_round_trip_gb_s'])}", "-", "-",
                     f"{s['copy_over_uvm_round_trip']:.2f}x"])
    return rows


def part_check(name: str, res: dict) -> C.Check:
    st = res["status"]
    ok = True if st == "ok" else None if st == "skipped" else False
    return C.Check(f"part {name} ran", st, "ok (skipped: the driver lacks a call)", ok, res.get("reason", ""))


def all_points(v: dict, key: str = "bit_exact") -> bool | None:
    pts = v.get("points", [])
    return all(p[key] for p in pts) if pts else None


def checks_for(parts: dict, truth: dict | None) -> list[C.Check]:
    checks = [part_check(n, r) for n, r in parts.items()]
    co = parts["copy_out"].get("managed_to_pinned", [])
    checks.append(C.Check("copy-out moved the data", f"{sum(p['bit_exact'] for p in co)}/{len(co)} sizes", "bit-exact",
                          all(p["bit_exact"] for p in co) if co else None))
    for variant in ("prefetch", "discard_and_prefetch"):
        v = parts["copy_in"].get(variant, {})
        ok = all_points(v)
        checks.append(C.Check(f"copy path round trip ({variant}) brings the data back", "-" if ok is None else ok,
                              "bit-exact, every size and repetition", ok, v.get("skipped", "")))
    ok = all_points(parts["uvm"])
    checks.append(C.Check("UVM round trip keeps the data", "-" if ok is None else ok, "bit-exact", ok))
    r = parts["remote"]
    if "read" in r:
        checks.append(C.Check("remote read checksum", r["read_checksum_ok"], "equal to the host's", r["read_checksum_ok"]))
        checks.append(C.Check("remote write landed", r["write_ok"], "every word written", r["write_ok"]))
        checks.append(C.Check("remote range stayed on the host", r["stayed_remote"],
                              "later passes < 0.5x GPU-resident speed", r["stayed_remote"],
                              "if FAIL the driver migrated the range: the read figure is not remote bandwidth"))
    s = summary(parts)
    ratio = s["copy_over_uvm_round_trip"]
    checks.append(C.Check("copy path beats UVM eviction (issue 33's premise)",
                          "-" if ratio is None else f"{ratio:.2f}x at {size_label(s['size_bytes'])}",
                          ">= 2x the UVM round trip", None if ratio is None else ratio >= 2.0,
                          "if FAIL the copy path is not worth building as planned"))
    if truth is not None:  # the fake's costs are known: the script's arithmetic must give them back
        checks.extend(truth_checks(parts, truth))
    return checks


def truth_checks(parts: dict, t: dict) -> list[C.Check]:
    def cmp(name, got, want, tol, part):
        if got is None:  # n/a where the part was skipped on purpose (--fake-unsupported), else a failure
            skipped = parts[part]["status"] == "skipped"
            return C.Check(f"dry run recovers {name}", f"not measured (part {part} {parts[part]['status']})",
                           f"within {tol:.0%}", None if skipped else False)
        err = got / want - 1
        return C.Check(f"dry run recovers {name}", f"{err:+.1%}", f"within {tol:.0%}", abs(err) <= tol)

    co = largest(parts["copy_out"].get("managed_to_pinned", []))
    up = largest(parts["uvm"].get("points", []))
    d = parts["discard"].get("ranges", {})
    r = parts["remote"].get("read") or {}
    m = parts["discard"].get("mem_get_info", {})
    mem_ok = m.get("discard_frees_memory") == "no" and (m.get("evict_freed_fraction") or 0) > 0.9
    return [cmp("copy_d2h_bw", co and co["gb_s"] * 1e9, t["copy_d2h_bw"], 0.10, "copy_out"),
            cmp("prefetch_host_bw", up and up["to_host"]["gb_s"] * 1e9, t["prefetch_host_bw"], 0.10, "uvm"),
            cmp("discard_block_s", d.get("per_block_us") and d["per_block_us"] * 1e-6, t["discard_block_s"], 0.25,
                "discard"),
            cmp("remote_read_bw", r.get("gb_s") and r["gb_s"] * 1e9, t["remote_read_bw"], 0.10, "remote"),
            C.Check("dry run reads the fake's GPU memory accounting", m.get("discard_frees_memory", "not measured"),
                    "discard: no; eviction: freed", mem_ok if m else None if parts["discard"]["status"] == "skipped"
                    else False)]


# ------------------------------------------------------------------------------------------------------- main

def parse_sizes(text: str) -> list[int]:
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.units import parse_size
    try:
        sizes = sorted({parse_size(s.strip(), "--sizes") for s in text.split(",") if s.strip()})
    except ConfigError as e:
        C.fail(NAME, str(e))
    if not sizes or any(s <= 0 or s % MB2 for s in sizes):
        C.fail(NAME, f"--sizes {text!r}: give sizes that are multiples of 2 MiB (the driver's block), e.g. 2MiB,64MiB,1GiB")
    return sizes


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("--sizes", default="2MiB,64MiB,1GiB", help="transfer sizes, multiples of 2 MiB (default 2MiB,64MiB,1GiB)")
    C.add_probe_arguments(p, "all GPU memory the script allocates")
    p.add_argument("--time-limit", type=float, default=280.0,
                   help="seconds for all parts together; each part also has its own limit (default 280)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="baseline file to update (default bench/baselines/gpu.json; out/gpu-dryrun/gpu.json with --dry-run)")
    p.add_argument("--no-baseline", action="store_true", help="do not write the baseline file")
    p.add_argument("--fake-unsupported", default="",
                   help="with --dry-run: CUDA calls (comma-separated) the fake driver answers cudaErrorNotSupported")
    args = p.parse_args(argv)
    sizes = parse_sizes(args.sizes)
    log = C.probe_log(args, NAME)
    if args.time_limit <= 0:
        C.fail(NAME, "--time-limit must be > 0")
    if args.fake_unsupported and not args.dry_run:
        C.fail(NAME, "--fake-unsupported needs --dry-run")
    C.require_gpu(args, NAME)

    truth = None
    if args.dry_run:
        from _evict_fake import TRUTH, FakeKernels, FakeRuntime
        rt, truth = FakeRuntime(unsupported=[s.strip() for s in args.fake_unsupported.split(",") if s.strip()]), TRUTH
        kernels = lambda cu: (FakeKernels(cu), [])  # noqa: E731
    else:
        try:
            from cuda.bindings import runtime as rt
        except ImportError:
            C.fail(NAME, "cuda-python is not installed (cuda-bindings 13: pip install 'uvmprefetch[cuda]')", 5)
        kernels = load_kernels
    try:
        cuda = Cuda(rt)
    except CudaError as e:
        C.fail(NAME, f"cannot start: {e}", 5)
    try:
        if not cuda.attribute("cudaDevAttrConcurrentManagedAccess"):
            C.fail(NAME, "this GPU/driver has no concurrent managed access: prefetch and discard are unavailable", 5)
        free, total = cuda.mem_get_info()
        budget = int(free * args.max_fraction)
        cap = (budget - 2 * MB2) // 2  # the managed arena (+2 MiB to align it) and a device buffer as large
        host = C.host_available_bytes()
        if host:
            cap = min(cap, host // 4 // 3)  # three pinned buffers of the arena's size, <= 1/4 of available RAM
        cap = cap // MB2 * MB2
        run_sizes, capped = [s for s in sizes if s <= cap], [s for s in sizes if s > cap]
        if not run_sizes:
            C.fail(NAME, f"the smallest size {size_label(sizes[0])} is over the cap of {cap >> 20} MiB "
                         f"({args.max_fraction:g} of {free / 2**30:.1f} GiB free on the GPU)", 5)
        log(f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free; cap {size_label(cap)} per buffer; sizes "
            + ", ".join(map(size_label, run_sizes)) + (f"; skipped over the cap: {', '.join(map(size_label, capped))}"
                                                       if capped else ""))
        b = Bench(cuda, run_sizes, max(run_sizes), args.reps, kernels, log)
        parts = run_parts(b, args.time_limit, log)
        versions = cuda.versions()
    except CudaError as e:
        C.fail(NAME, f"setup failed: {e}", 1)
    finally:
        try:
            cuda.close()
        except Exception as e:  # noqa: BLE001 - after a failure the context may be gone; say so, keep the result
            log(f"cleanup: {type(e).__name__}: {e}")

    parts = clean(parts)
    memory = {"free_bytes": free, "total_bytes": total, "max_fraction": args.max_fraction, "budget_bytes": budget,
              "cap_bytes": cap, "arena_bytes": b.n, "gpu_bytes_allocated": 2 * b.n + MB2,
              "free_drop_after_setup_bytes": b.setup_drop,
              "sizes": run_sizes, "sizes_over_cap": capped}
    s = clean(summary(parts))
    payload = {"memory": memory, "cuda": versions, "parts": parts, "summary": s,
               "fake_truth": truth, "part_limits_s": PART_LIMITS}
    if not args.no_baseline:
        env = C.environment(args.dry_run)
        mb = {f"evict/{k}": v for k, v in parts.items()}
        mb["evict/summary"] = {**s, "memory": memory}
        path = baseline.path_for(args.dry_run, args.baseline)
        baseline.update(path, env.get("device"), env, microbench=clean(mb))
        payload["baseline"] = str(path)
        log(f"microbench entries written to {path}")
    return C.finish(args, NAME, payload, ["part", "measure", "size", "GB/s", "GPU us", "host us held", "note"],
                    table_rows(parts, memory), checks_for(parts, truth))


if __name__ == "__main__":
    sys.exit(main())
