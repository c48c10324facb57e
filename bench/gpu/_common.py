"""Plumbing shared by the ``bench/gpu`` validation scripts.

Every script follows the same shape (docs/design.md §5): parse arguments, refuse cleanly without a GPU unless
``--dry-run``, measure, *check* the measurements against their targets, write one JSON file (device name,
driver, torch version, date, the raw numbers, the checks) and print a Markdown table last, so that the tail
of a device call's output holds the answer.

Training runs happen in child processes (``train_worker.py``) so that each mode (plain PyTorch, managed
memory without prefetch, ``deepum``, ``uvmprefetch``) starts from a clean CUDA context and the runtime is
switched on exactly as a user would switch it on: by environment variables (docs/design.md §4).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# A run writes to --out; without it to ./<script>-<UTC date-time>/ under the current directory, never into the
# tree. The figures the project quotes go to bench/baselines/gpu.json through baseline.py. Dry runs default to
# /out/gpu-dryrun/ (git-ignored), where the dry-run tests and run_all.sh look for them.
DRYRUN_DIR = REPO / "out" / "gpu-dryrun"
WORKER = HERE / "train_worker.py"

EXIT_NO_GPU = 5  # uvmprefetch.errors.DeviceError.exit_code
EXIT_CHECK_FAILED = 1

# Every UVMPREFETCH_* variable of docs/design.md §4: cleared before a child starts so that only the mode under test
# decides what is switched on (a stray UVMPREFETCH=1 in the caller's shell would otherwise turn the "plain"
# baseline into a managed run).
RUNTIME_VARS = ("UVMPREFETCH", "UVMPREFETCH_BUDGET", "UVMPREFETCH_POLICY", "UVMPREFETCH_WINDOW",
                "UVMPREFETCH_REPORT", "UVMPREFETCH_TRACE", "UVMPREFETCH_BACKEND", "UVMPREFETCH_LOG", "UVMPREFETCH_GPU",
                "UVMPREFETCH_MOVER", "UVMPREFETCH_DISCARD", "UVMPREFETCH_DISCARD_AUDIT", "UVMPREFETCH_MANAGED_LIMIT",
                "UVMPREFETCH_OBSERVER", "UVMPREFETCH_TEST_FAIL", "UVMPREFETCH_EVICT", "UVMPREFETCH_HOST_LIMIT")

# The shared-GPU rule (docs/design.md §5): the GPUs these scripts run on are shared, and asking one for more
# managed memory than it has free can hang it. So every child process gets the shim's old cap, the GPU's free
# memory - 5 % (the product's default is what host memory can back), and memory pressure comes from
# UVMPREFETCH_BUDGET. Every process these scripts and tests/gpu start gets its environment from child_env
# (tests/unit/test_gpu_children_keep_gpu_free.py reads them to check); run_all.sh exports the same.
SHARED_GPU_ENV = {"UVMPREFETCH_MANAGED_LIMIT": "gpu-free"}


def child_env(extra: dict | None = None, base=None) -> dict:
    """The environment of a child process: ``base`` (default: this process's environment without
    ``RUNTIME_VARS``, so that only the mode under test switches anything on), then ``extra``, then
    ``SHARED_GPU_ENV``, which nothing overrides."""
    env = dict(base) if base is not None else {k: v for k, v in os.environ.items() if k not in RUNTIME_VARS}
    env.update(extra or {})
    env.update(SHARED_GPU_ENV)
    return env

# mode -> policy the runtime runs. "managed" is managed memory with the driver's demand paging and no prefetch
# (the "naive UM" baseline of DeepUM/G10); the runtime's budget still evicts so that it feels the same pressure.
MODES = {"plain": None, "managed": "demand", "deepum": "deepum", "uvmprefetch": "uvmprefetch"}


# --------------------------------------------------------------------------------------------------- CLI shape

def parser(name: str, description: str, epilog: str = "") -> argparse.ArgumentParser:
    """The argument parser every script starts from: ``--dry-run``, ``--out DIR``, ``--seed``."""
    p = argparse.ArgumentParser(prog=f"bench/gpu/{name}.py", description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="run the same code path on the CPU (tiny model, few iterations, the runtime's dryrun "
                        "backend, fake timings for calibration) to exercise the script without a GPU")
    p.add_argument("--out", type=Path, default=None,
                   help=f"directory for the JSON result (default: ./{name}-<UTC date-time>/, or "
                        f"{DRYRUN_DIR.relative_to(REPO)}/ with --dry-run)")
    p.set_defaults(script_name=name)
    p.add_argument("--seed", type=int, default=1234, help="seed of model init and data (default 1234)")
    return p


def add_workload_arguments(p: argparse.ArgumentParser, *, config: str, iters: int, warmup: int) -> None:
    """The training workload's flags (``Workload``'s fields), with each script's own defaults for the size,
    the iteration count and the warm-up left out of the median."""
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    p.add_argument("--config", default=config, help=f"model size (default {config})")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"], help="bf16 = autocast (default)")
    p.add_argument("--iters", type=int, default=iters, help=f"training iterations per run (default {iters})")
    p.add_argument("--warmup", type=int, default=warmup,
                   help=f"iterations left out of the median (default {warmup})")


def add_probe_arguments(p: argparse.ArgumentParser, fraction_of: str) -> None:
    """The flags of the scripts that probe the GPU with their own allocations (calibrate, evict_microbench):
    ``--max-fraction`` (of the free GPU memory that ``fraction_of`` may take), ``--reps``, ``--quiet``."""
    p.add_argument("--max-fraction", type=float, default=0.10,
                   help=f"{fraction_of}, as a fraction of the GPU's free memory (default 0.10)")
    p.add_argument("--reps", type=int, default=5, help="repetitions per point; the median is kept (default 5)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def probe_log(args, name: str):
    """Check ``add_probe_arguments``' flags (one line and exit 2 if wrong); the progress printer (stderr)."""
    if not 0 < args.max_fraction <= 0.5:
        fail(name, f"--max-fraction {args.max_fraction}: must be in (0, 0.5]: the GPU may be shared, its memory "
                   "must stay well under what is free")
    if args.reps < 1:
        fail(name, "--reps must be >= 1")
    return (lambda s: None) if args.quiet else (lambda s: print(f"[{name}] {s}", file=sys.stderr, flush=True))


def add_budget_arguments(p: argparse.ArgumentParser, *, timeout: float, deadline: float, why: str) -> None:
    """``--ratios`` (working set / budget), ``--timeout`` (per training run) and ``--deadline`` (the whole
    script: no run starts after it, runs are cut to what is left; ``why`` says what the default fits)."""
    p.add_argument("--ratios", default="1.5,2", help="working set / budget ratios (default 1.5,2)")
    p.add_argument("--timeout", type=float, default=timeout,
                   help=f"seconds allowed per training run (default {timeout:g})")
    p.add_argument("--deadline", type=float, default=deadline,
                   help="seconds for the whole script: runs are cut to what is left of it and cases not started "
                        f"by then are skipped (default {deadline:g}, {why})")


def parse_ratios(name: str, text: str) -> list[float]:
    """``--ratios`` (working set / budget, comma-separated, each > 1); a bad value is one line and exit 2."""
    try:
        ratios = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(name, f"--ratios {text!r}: expected numbers like 1.5,2")
    if not ratios or any(r <= 1.0 for r in ratios):
        fail(name, f"--ratios {text!r}: every ratio must be > 1 (1 = no oversubscription)")
    return ratios


def out_dir(args) -> Path:
    """The run's folder (created): ``--out``, else the default of ``parser``'s help, fixed on first use so that
    every file of one run lands in the same folder."""
    if args.out is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        args.out = DRYRUN_DIR if args.dry_run else Path.cwd() / f"{getattr(args, 'script_name', 'gpu')}-{stamp}"
    args.out.mkdir(parents=True, exist_ok=True)
    return args.out


def gpu_visible() -> tuple[bool, str]:
    """(True, name) when torch sees a CUDA GPU; (False, why) otherwise. Never raises."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means "no GPU path"
        return False, f"torch does not import ({type(e).__name__}: {e})"
    try:
        if not torch.cuda.is_available():
            return False, f"torch {torch.__version__} sees no CUDA GPU (torch.cuda.is_available() is False)"
        return True, torch.cuda.get_device_name(0)
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA initialisation failed ({type(e).__name__}: {e})"


def require_gpu(args, name: str) -> None:
    """Exit with one line and code 5 when there is no GPU and ``--dry-run`` was not given."""
    if args.dry_run:
        return
    ok, why = gpu_visible()
    if not ok:
        sys.stderr.write(f"{name}: no GPU: {why}; run it on a GPU machine or pass --dry-run\n")
        sys.exit(EXIT_NO_GPU)


def fail(name: str, msg: str, code: int = 2) -> "None":
    """Bad input or an unusable setup: one line on stderr, non-zero exit, no traceback."""
    sys.stderr.write(f"{name}: {msg}\n")
    sys.exit(code)


# --------------------------------------------------------------------------------------------- environment

def _run_quiet(cmd: list[str], timeout: float = 15.0) -> str:
    try:
        r = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout, check=False)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(dry_run: bool) -> dict:
    """Device name, driver, torch/CUDA/transformers versions, commit and date: the header of every result."""
    env: dict = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "python": platform.python_version(),
        "dry_run": bool(dry_run),
        "commit": _run_quiet(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]) or "unknown",
    }
    try:
        import torch
        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda or "none"
    except Exception:  # noqa: BLE001
        env["torch"] = "missing"
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        env["transformers"] = "missing"
    try:
        import uvmprefetch
        env["uvmprefetch"] = uvmprefetch.__version__
    except Exception:  # noqa: BLE001
        env["uvmprefetch"] = "missing"
    if dry_run:
        env.update(device="cpu (dry-run)", driver="n/a", gpu_memory_bytes=0)
        return env
    line = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"])
    if line:
        name, driver, mem = [s.strip() for s in line.splitlines()[0].split(",")][:3]
        env.update(device=name, driver=driver, gpu_memory_bytes=int(float(mem) * 2**20))
    else:  # no nvidia-smi: ask torch (the driver version is then unknown)
        import torch
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, driver="unknown (no nvidia-smi)", gpu_memory_bytes=int(props.total_memory))
    try:
        import torch
        free, total = torch.cuda.mem_get_info()
        env.update(gpu_free_bytes_at_start=int(free), gpu_total_bytes=int(total))
    except Exception:  # noqa: BLE001
        pass
    return env


# ------------------------------------------------------------------------------------------------ results

@dataclass
class Check:
    """One target a script checks. ``ok`` is None when the target does not apply (say, timing in a dry run)."""

    name: str
    value: object
    target: str
    ok: bool | None
    note: str = ""

    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[self.ok]


def md_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table (pipes in cells escaped)."""
    def cell(v) -> str:
        if isinstance(v, float):
            v = f"{v:.4g}" if math.isfinite(v) else str(v)
        return str(v).replace("|", "\\|")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def checks_table(checks: list[Check]) -> str:
    return md_table(["check", "value", "target", "status", "note"],
                    [[c.name, c.value, c.target, c.status(), c.note] for c in checks])


def finish(args, name: str, payload: dict, headers: list[str], rows: list[list], checks: list[Check]) -> int:
    """Write ``<out>/<name>.json``, print the tables last, return the exit code (1 if any check failed)."""
    payload = {"script": f"bench/gpu/{name}.py", "env": environment(args.dry_run), **payload,
               "table": {"headers": headers, "rows": rows}, "checks": [asdict(c) for c in checks]}
    payload["passed"] = all(c.ok is not False for c in checks)
    path = out_dir(args) / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=_json_default) + "\n")
    env = payload["env"]
    print(f"\n## {name} — {env.get('device')} (driver {env.get('driver')}, torch {env.get('torch')}, "
          f"{env['date_utc']}){' [dry-run]' if args.dry_run else ''}")
    print(f"result: {path}")
    print(md_table(headers, rows))
    print()
    print(checks_table(checks))
    print(f"{name}: {'PASS' if payload['passed'] else 'FAIL'}")
    sys.stdout.flush()
    return 0 if payload["passed"] else EXIT_CHECK_FAILED


def _json_default(o):
    try:
        import numpy as np
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ----------------------------------------------------------------------------------------- training runs

@dataclass
class Workload:
    """What ``train_worker.py`` trains. ``config`` names a size of ``model`` (see the worker's CONFIGS)."""

    model: str = "gpt2"
    config: str = "small"
    batch: int = 8
    seq: int = 512
    iters: int = 20
    warmup: int = 3
    dtype: str = "fp32"
    deterministic: bool = False
    # AdamW's foreach path is one dispatcher op over every parameter, gradient and moment: no budget below the
    # whole optimizer state could hold that op, so the oversubscription runs use the per-parameter loop.
    foreach: str = "auto"

    def argv(self) -> list[str]:
        a = ["--model", self.model, "--config", self.config, "--batch", str(self.batch), "--seq", str(self.seq),
             "--iters", str(self.iters), "--dtype", self.dtype, "--foreach", self.foreach]
        return a + (["--deterministic"] if self.deterministic else [])

    def label(self) -> str:
        return f"{self.model}-{self.config} b{self.batch} s{self.seq} {self.dtype}"


def tiny_workload(iters: int = 3, **kv) -> Workload:
    """The dry-run model: a 2-layer GPT-2 ("mini", 2.7 M parameters, ~40 MB of optimizer state: tens of 2 MB
    blocks, so half of it is still a usable budget) that trains an iteration in ~0.1 s on one CPU core."""
    return Workload(**{"model": "gpt2", "config": "mini", "batch": 4, "seq": 128, "iters": iters, "warmup": 1, **kv})


def run_training(mode: str, work: Workload, workdir: Path, case: str, *, seed: int, dry_run: bool,
                 budget: int | None = None, trace: bool = False, timeout: float = 600.0,
                 extra_env: dict | None = None, worker_args: list[str] = ()) -> dict:
    """Train ``work`` in a child process in ``mode`` and return the worker's result dict.

    ``worker_args`` go to ``train_worker.py`` after the workload's own (its memory-saving methods, a memory
    cap, a time limit). A worker that ran out of memory exits with code 3 and still writes its result (``oom``).

    The result has ``losses`` (floats), ``losses_hex`` (exact), ``iter_s`` (per-iteration wall time), ``peak_*``
    memory figures, and what this function adds: ``mode``, ``case``, ``returncode``, ``stderr_tail``,
    ``report`` (the runtime's JSON report, or None) and ``runtime_active`` (True when the runtime wrote its
    report, i.e. it really ran: a missing start-up hook would otherwise make a "uvmprefetch" run a plain one
    and every comparison would pass vacuously).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{case}.worker.json"
    report = workdir / f"{case}.report.json"
    trace_path = workdir / f"{case}.uvmt"
    for p in (out, report, trace_path):
        p.unlink(missing_ok=True)
    env = training_env(work.deterministic)
    policy = MODES[mode]
    if policy is not None:
        env.update(UVMPREFETCH="1", UVMPREFETCH_POLICY=policy, UVMPREFETCH_REPORT=str(report),
                   UVMPREFETCH_BACKEND="dryrun" if dry_run else "cuda")
        if budget is not None:
            env["UVMPREFETCH_BUDGET"] = str(int(budget))
        if trace:
            env["UVMPREFETCH_TRACE"] = str(trace_path)
    env.update(extra_env or {})
    cmd = [sys.executable, str(WORKER), *work.argv(), "--seed", str(seed), "--out", str(out),
           "--device", "cpu" if dry_run else "cuda", *worker_args]
    t0 = time.perf_counter()
    rc, err = run_child(cmd, env, timeout)
    res: dict = {}
    if out.exists():  # written at the end of a run, also of one that ran out of memory
        res = json.loads(out.read_text())
    res.update(mode=mode, case=case, policy=policy, budget=budget, returncode=rc, wall_s=time.perf_counter() - t0,
               stderr_tail=err[-2000:], workload=asdict(work))
    res["report"] = json.loads(report.read_text()) if report.exists() else None
    res["runtime_active"] = res["report"] is not None
    res["trace"] = str(trace_path) if trace and trace_path.exists() else None
    return res


def training_env(deterministic: bool) -> dict:
    """The environment of a training child: ours without any ``UVMPREFETCH*`` variable (the caller adds the
    mode's), this repository importable, no model hub, the shared-GPU limit (``child_env``)."""
    extra = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
             "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
             "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"), "PYTHONUNBUFFERED": "1"}
    if deterministic:
        extra["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS refuses deterministic mode without it
    return child_env(extra)


def run_child(cmd: list[str], env: dict, timeout: float) -> tuple[int, str]:
    """(exit code, stderr) of ``cmd``; a run past ``timeout`` is exit code 124 with what it wrote so far."""
    try:
        r = subprocess.run(cmd, env=child_env(base=env), capture_output=True, text=True, timeout=timeout,
                           check=False)
        return r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, err + f"\n[timed out after {timeout:.0f} s]"


def run_ok(res: dict) -> tuple[bool, str]:
    """Did a training run do what its mode says? (exit 0, finite losses, runtime active iff it should be)."""
    if res["returncode"] != 0:
        last = [ln for ln in res["stderr_tail"].splitlines() if ln.strip()]
        return False, f"exit {res['returncode']}: {last[-1] if last else 'no stderr'}"
    if not res.get("losses") or not all(math.isfinite(x) for x in res["losses"]):
        return False, "non-finite or missing losses"
    if res["policy"] is not None and not res["runtime_active"]:
        return False, "runtime not active: UVMPREFETCH=1 wrote no report (start-up hook missing?)"
    if res["policy"] is not None and res["report"].get("degraded"):
        errs = res["report"].get("errors") or ["no error recorded"]
        return False, f"runtime degraded to plain managed memory: {str(errs[0])[:200]}"
    return True, ""


def steady_median(iter_s: list[float], warmup: int) -> float:
    """Median iteration time after the first ``warmup`` iterations (optimizer state, autotuning, learning)."""
    xs = iter_s[warmup:] if len(iter_s) > warmup else iter_s
    return statistics.median(xs) if xs else float("nan")


# Iterations a run that fits still pays for besides compute: iteration 0 starts up (and creates the optimizer
# state at its step), iteration 1 places its activations around that state, so the address space grows and it
# still takes first-touch faults (dryrun: +27 % over iteration 2 for the tiny model). The compute reference
# skips them, on a GPU as in a dry run.
FIRST_TOUCH_ITERS = 2


def steady_reference(iter_s: list[float], warmup: int) -> tuple[float, str]:
    """(median, which iterations) of a reference run's steady iterations: those from ``max(warmup,
    FIRST_TOUCH_ITERS)`` on, else the last one (a short run); NaN when there are none."""
    skip = max(int(warmup), FIRST_TOUCH_ITERS)
    if len(iter_s) > skip:
        return statistics.median(iter_s[skip:]), (f"iteration {skip}" if len(iter_s) == skip + 1
                                                  else f"iterations {skip}-{len(iter_s) - 1}")
    if iter_s:
        return float(iter_s[-1]), f"iteration {len(iter_s) - 1} (the last; fewer than {skip + 1} ran)"
    return float("nan"), "no iterations"


def report_get(report: dict | None, *keys, default=None):
    """The first of ``keys`` (dotted paths) that the runtime report has with a non-null value.

    The field names are the runtime's contract (docs/runtime.md); fallbacks matter where a figure may be
    unobservable, e.g. ``faults`` is null on the cuda backend without CUPTI and ``expected_faults`` stands in.
    """
    if not report:
        return default
    for k in keys:
        cur = report
        for part in k.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            else:
                break
        else:
            if cur is not None:
                return cur
    return default


def iteration_times(res: dict, dry_run: bool) -> tuple[list[float], str]:
    """Per-iteration times of a run and where they come from.

    On a GPU: the worker's wall clock (what a user sees). In a dry run under the runtime: the simulated GPU's
    per-iteration times from the dryrun backend's report when it has them (CPU wall time says nothing about
    a GPU), else the CPU wall clock, labelled as such.
    """
    if dry_run and res.get("report"):
        sim = report_get(res["report"], "model_iter_s", "backend_result.iteration_times_s")
        if sim:
            return [float(x) for x in sim], "simulated GPU (dryrun report)"
    return list(res.get("iter_s", [])), "CPU wall clock" if dry_run else "GPU wall clock"


def working_set_bytes(res: dict) -> int:
    """Bytes a training run needs on the device: CUDA peak reserved (what the caching allocator took, i.e. the
    managed allocation under the runtime), else the runtime report's peak managed bytes (dry run), else the
    parameter/gradient/AdamW state alone."""
    ws = res.get("peak_reserved_bytes") or report_get(res.get("report"), "peak_managed_bytes", "managed.peak_bytes",
                                                      "peak_bytes")
    return int(ws or res.get("state_bytes") or 0)


def sized_working_set(name: str, ref: dict, dry_run: bool, hint: str = "") -> int:
    """The working set measured by a reference run (``working_set_bytes``); one line and exit 1 when the run
    failed, reported no figure, or (on a GPU) needs more than 90 % of the free memory: managed memory must stay
    under free memory (docs/design.md §5)."""
    ok, why = run_ok(ref)
    if not ok:
        fail(name, f"the reference run failed ({why}): the workload must fit the GPU to measure its working "
                   f"set; pick a smaller --config/--batch{hint}", 1)
    ws = working_set_bytes(ref)
    if ws <= 0:
        fail(name, "no working-set figure: the sizing run reported no peak bytes", 1)
    check_fits_free(name, ws, dry_run)
    return ws


@dataclass
class PairedRuns:
    """What the scripts that compare two runtime settings per budget ratio share (discards.py, copypath.py):
    validated ``ratios``, the ``work``-load, ``run(mode, case, **kw)`` bounded by the deadline, ``left()`` seconds,
    the working set ``ws`` and, on a GPU, the plain run's steady s/iter ``t_plain`` (None with --working-set)."""

    ratios: list
    work: "Workload"
    run: object
    left: object
    ws: int
    t_plain: float | None

    def run_pairs(self, variants: list[tuple[str, dict, dict]]) -> tuple[list[dict], list[str]]:
        """Each ratio with each variant ``(case suffix, fields, env)`` in turn, until the deadline: a ``uvmprefetch``
        run at the ratio's budget with ``env``, its result updated with ``ratio`` and ``fields``. Name the setting
        under test first: when the deadline cuts, its reference is what goes. Returns (runs, skipped cases)."""
        runs, skipped = [], []
        for ratio in self.ratios:
            for suffix, fields, env in variants:
                case = f"{ratio:g}x-{suffix}"
                if self.left() <= 0:
                    skipped.append(case)
                    continue
                r = self.run("uvmprefetch", case, budget=int(self.ws / ratio), extra_env=env)
                r.update(ratio=ratio, **fields)
                runs.append(r)
        return runs, skipped

    def each(self, runs: list[dict], dry_run: bool):
        """Each run with its figures (``facts``) and the other run at its ratio (None where that one did not run)."""
        for r in runs:
            yield r, self.facts(r, dry_run), next((o for o in runs if o is not r and o["ratio"] == r["ratio"]), None)

    def facts(self, r: dict, dry_run: bool) -> "RunFacts":
        """What every run of these scripts reports: see ``RunFacts``."""
        ok, why = run_ok(r)
        rep = r.get("report")
        iters = int(report_get(rep, "iterations", default=len(r.get("losses", [])))) or 1
        t = steady_median(iteration_times(r, dry_run)[0], self.work.warmup) if ok else math.nan
        d2h, h2d, src = d2h_h2d(rep)
        return RunFacts(ok, why, rep, t, *(None if x is None else x / iters / GIB for x in (d2h, h2d)), src)

    def finish(self, args, name: str, baseline_file: Path, runs: list[dict], skipped: list[str], headers: list[str],
               rows: list[list], checks: list[Check]) -> int:
        """``finish`` with the payload these scripts share; a case the deadline skipped is a failed check."""
        checks += [Check(f"{case} ran", "skipped: --deadline reached", "ok", False) for case in skipped]
        payload = {"workload": self.work.__dict__, "working_set_bytes": self.ws, "ratios": self.ratios,
                   "plain_s_per_iter": self.t_plain, "baseline_file": str(baseline_file), "skipped": skipped,
                   "runs": [{k: v for k, v in r.items() if k != "stderr_tail" or not run_ok(r)[0]} for r in runs]}
        return finish(args, name, payload, headers, rows, checks)


GIB = float(1 << 30)


@dataclass
class RunFacts:
    """A paired run's figures: it ran (``ok``) or why not, its runtime ``report``, steady s/iter ``t`` (NaN when it
    failed), GiB moved per iteration each way, and where those bytes come from (``d2h_h2d``)."""

    ok: bool
    why: str
    report: dict | None
    t: float
    d2h_gib_per_iter: float | None
    h2d_gib_per_iter: float | None
    bytes_source: str


def d2h_h2d(report: dict | None) -> tuple[float | None, float | None, str]:
    """(D2H bytes, H2D bytes, source) of a run: CUPTI's unified-memory counters where the runtime had them,
    else the runtime's books (blocks it evicted / prefetched or faulted, times the block size)."""
    d = report_get(report, "backend_result.cupti.um_bytes_dtoh")
    h = report_get(report, "backend_result.cupti.um_bytes_htod")
    if d is not None and h is not None:
        return float(d), float(h), "cupti"
    d, h = report_get(report, "bytes_dtoh"), report_get(report, "bytes_htod")
    return (float(d) if d is not None else None), (float(h) if h is not None else None), "books"


def same_losses(r: dict, ok: bool, ref: dict | None) -> bool | None:
    """Whether run ``r`` (``ok``: it ran) computed bit-equal losses to ``ref`` (None: no pair to compare)."""
    if ref is None or not ok or not run_ok(ref)[0]:
        return None
    return r["losses_hex"] == ref["losses_hex"]


def losses_check(label: str, r: dict, ref: dict, equal: bool, strict: bool = True) -> Check:
    """Two runs that must compute the same losses: a difference is lost data, named by its first iteration.
    ``strict=False`` (nondeterministic kernels, which cannot tell lost data from noise): informational."""
    first = next((i for i, (a, b) in enumerate(zip(r["losses_hex"], ref["losses_hex"])) if a != b), None)
    return Check(label, "bit-equal" if equal else f"differ from iteration {first}",
                 "bit-equal (a difference is lost data)" if strict else "informational", equal if strict else None)


def add_paired_arguments(p: argparse.ArgumentParser, *, deadline: float, why: str) -> None:
    """The arguments ``paired_runs`` reads: the workload (GPT-2 large, 7 iterations, 2 warm-up), the time budget
    (``deadline`` seconds in all: ``why``) and ``--working-set``."""
    add_workload_arguments(p, config="large", iters=7, warmup=2)
    add_budget_arguments(p, timeout=150.0, deadline=deadline, why=why)
    p.add_argument("--working-set", type=int, default=None,
                   help="working set in bytes (e.g. oversub.json's working_set_bytes): skips the plain sizing run")


def paired_runs(name: str, args, dry_env: dict | None = None) -> PairedRuns:
    """Check the arguments (``add_workload_arguments``, ``add_budget_arguments``, ``--working-set``,
    deterministic kernels unless ``--nondeterministic``), then size the working set with a plain run (an unbudgeted
    runtime run in a dry run, with ``dry_env``) unless ``--working-set`` gives it. Bad arguments: one line, exit 2."""
    require_gpu(args, name)
    ratios = parse_ratios(name, args.ratios)
    if args.iters <= args.warmup or args.iters < 2:
        fail(name, "--iters must be at least 2 and larger than --warmup")
    if args.working_set is not None and args.working_set <= 0:
        fail(name, f"--working-set {args.working_set}: must be a positive number of bytes")
    if args.timeout <= 0 or args.deadline <= 0:
        fail(name, "--timeout and --deadline must be positive")
    start = time.monotonic()
    det = not getattr(args, "nondeterministic", False)
    if args.dry_run:
        work = tiny_workload(iters=max(3, min(args.iters, 4)), foreach="off", deterministic=det)
    else:
        work = Workload(args.model, args.config, args.batch, args.seq, args.iters, args.warmup, args.dtype,
                        deterministic=det, foreach="off")
    wdir = out_dir(args) / f"{name}-runs"

    def left() -> float:
        return args.deadline - (time.monotonic() - start)

    def run(mode, case, **kw):
        return run_training(mode, work, wdir, case, seed=args.seed, dry_run=args.dry_run,
                            timeout=max(30.0, min(args.timeout, left())), **kw)

    plain = None
    ws = args.working_set
    if ws is None:
        plain = (run("uvmprefetch", "unbudgeted", extra_env=dict(dry_env or {})) if args.dry_run
                 else run("plain", "plain"))
        ws = sized_working_set(name, plain, args.dry_run, " or pass --working-set")
    else:
        check_fits_free(name, ws, args.dry_run)
    t_plain = (steady_median(iteration_times(plain, args.dry_run)[0], 1)
               if plain is not None and not args.dry_run else None)
    return PairedRuns(ratios, work, run, left, ws, t_plain)


def check_fits_free(name: str, ws: int, dry_run: bool) -> None:
    """On a GPU: one line and exit 1 when ``ws`` bytes exceed 90 % of the free memory."""
    if dry_run:
        return
    free = environment(False).get("gpu_free_bytes_at_start", 0)
    if ws > 0.9 * free:
        fail(name, f"working set {ws / 2**30:.1f} GiB exceeds 90 % of the {free / 2**30:.1f} GiB free: managed "
                   "memory must stay under free memory (docs/design.md §5)", 1)


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def which(prog: str) -> str | None:
    return shutil.which(prog)


def host_available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
