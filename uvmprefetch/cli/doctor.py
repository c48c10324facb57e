"""``uvmprefetch doctor``: can the live runtime work here? One line per check: ok / missing, and why."""

from __future__ import annotations

import os
import shutil
import sys

NAME = "doctor"
HELP = "check the driver, GPU features, cuda-python, CUPTI, the shim, the observer and torch"
DESCRIPTION = ("Check what the live runtime needs, one line each: NVIDIA driver and its version, GPU, managed "
               "memory and concurrent managed access, CUDA 13 batched prefetch/discard, the CUDA runtime "
               "library, cuda-python, CUPTI (cupti-python), the LD_PRELOAD shim (built here if it is not yet), "
               "which observer a run uses (the C++ one, or the Python dispatch mode it falls back to) and why, "
               "the managed-memory limit and the budget that a run would get and why, torch and its CUDA build, "
               "the start-up hook. Works without a GPU: it says what is missing. Exit 0 when the cuda backend can "
               "run, 1 when something it needs is missing (the dryrun backend works anywhere torch does).")
EPILOG = """\
examples:
  uvmprefetch doctor
  uvmprefetch doctor --json
"""


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print {checks: [{name, ok, detail, required}], cuda_ready}")


def checks() -> list[dict]:
    """Every check as ``{name, ok, detail, required}`` (``required``: the cuda backend cannot run without it)."""
    from ..runtime.device import BATCH_MIN_DRIVER, Driver, have_module
    out = []

    def add(name, ok, detail, required=True):
        out.append({"name": name, "ok": bool(ok), "detail": detail, "required": required})

    d = Driver()
    add("nvidia driver", d.version is not None,
        f"libcuda.so.1, driver API {d.version // 1000}.{d.version % 1000 // 10}" if d.version else d.error)
    add("gpu", d.devices > 0 and not d.error,
        f"{d.devices} device(s), GPU 0: {d.name}, {d.total_bytes / 2**30:.1f} GiB" if d.devices and d.total_bytes
        else (d.error or "no GPU"))
    why = "no GPU to ask" if d.error else ""
    add("managed memory", d.managed, "supported" if d.managed else (why or "GPU 0 has no managed memory"))
    add("concurrent managed access", d.concurrent_managed,
        "supported (prefetch/evict while kernels run)" if d.concurrent_managed
        else (why or "not supported (pre-Pascal, Windows or WSL): prefetch and eviction need it"))
    add("batched prefetch/discard", d.batch_api,
        "cuMemPrefetchBatchAsync/cuMemDiscardBatchAsync present" if d.batch_api
        else (why or f"needs driver >= {BATCH_MIN_DRIVER // 1000}.0; single prefetch calls are used, no discards"),
        required=False)
    add("cuda runtime", _cudart(), _cudart() or "libcudart.so.13 not found (comes with torch's CUDA wheels)")
    add("cuda-python", have_module("cuda.bindings"),
        _version("cuda-bindings") or "missing: pip install 'uvmprefetch[cuda]'")
    add("cupti", have_module("cupti"), _version("cupti-python") or
        "missing (optional: GPU fault and cuBLAS/cuDNN launch observation): pip install 'uvmprefetch[cupti]'",
        required=False)
    add("shim", *_shim())
    add("observer", *_observer(), required=False)
    add("allocator tracker", *_tracker(), required=False)
    add("managed limit", *_managed_limit(d.total_bytes or 0), required=False)
    add("budget", *_budget(d.total_bytes or 0), required=False)
    try:
        import torch
        cuda = torch.version.cuda
        add("torch", True, f"{torch.__version__}" + (f", CUDA {cuda} build" if cuda else ", CPU-only build"),
            required=True)
        add("torch cuda build", bool(cuda), f"CUDA {cuda}" if cuda else "CPU-only torch: the cuda backend needs a "
            "CUDA build of torch (dryrun works)")
    except ImportError as e:
        add("torch", False, f"not importable: {e}")
    add("start-up hook", _hook_installed(), _hook_installed() or "uvmprefetch-startup.pth not in site-packages "
        "(reinstall: pip install -e .); UVMPREFETCH=1 will do nothing, `uvmprefetch run` still works",
        required=False)
    return out


def _cudart() -> str:
    import ctypes
    try:
        ctypes.CDLL("libcudart.so.13")
        return "libcudart.so.13 loadable"
    except OSError:
        pass
    try:
        import nvidia.cuda_runtime  # noqa: F401 - the pip wheel torch depends on
        base = os.path.dirname(nvidia.cuda_runtime.__file__)
        for root, _, files in os.walk(base):
            for f in files:
                if f.startswith("libcudart.so.13"):
                    return os.path.join(root, f)
    except ImportError:
        pass
    return ""


def _version(dist: str) -> str:
    from importlib import metadata
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return ""


def _shim() -> tuple[bool, str]:
    """Built here if it is not yet (what ``UVMPREFETCH=1`` would do first; the limit check asks it)."""
    from ..errors import ShimError
    from ..runtime.shim import built_path, shim_path
    try:
        was = built_path().is_file()
        return True, f"{'built' if was else 'built now'}: {shim_path()}"
    except ShimError as e:
        return False, str(e)


def _managed_limit(total: int) -> tuple[bool, str]:
    """The shim's own answer to "how much managed memory may a run allocate here" (``uvmshim_plan_limit``: this
    machine's host memory and cgroups; the GPU's free memory is only known at the first allocation, so its
    total stands in)."""
    from ..config import managed_limit_from_env
    from ..errors import UvmPrefetchError
    from ..runtime.memory import describe_limit
    from ..runtime.shim import Shim, shim_path
    spec = os.environ.get("UVMPREFETCH_MANAGED_LIMIT", "")
    try:
        managed_limit_from_env(os.environ)  # first: the shim ends the process it loads into on a bad value
        lim = Shim(shim_path()).plan_limit(total, total, spec)
    except UvmPrefetchError as e:
        return False, str(e)
    return True, describe_limit(lim, gpu_known=False)


def _budget(total: int) -> tuple[bool, str]:
    from ..config import parse_budget
    from ..errors import ConfigError
    from ..units import format_size
    text = os.environ.get("UVMPREFETCH_BUDGET", "").strip()
    if not text:
        gpu = f" (at most {format_size(total - total // 20)} here)" if total else ""
        return True, (f"UVMPREFETCH_BUDGET unset: the GPU's free memory at start - 5 %{gpu}; the runtime evicts to "
                      "the host to keep GPU-resident managed memory under it")
    try:
        b = parse_budget(text)
    except ConfigError as e:
        return False, str(e)
    at = f" = {format_size(b.resolve(total))} here" if total and b.fraction is not None else ""
    return True, f"UVMPREFETCH_BUDGET={text}: {b}{at}; refused at start-up if above the GPU's free memory"


def _observer() -> tuple[bool, str]:
    """Which observer a run here would use, and why (without building anything)."""
    from ..runtime import native_observer
    from ..runtime.native import OBSERVER, NativeBuildError, build_key, folder_for
    if os.environ.get("UVMPREFETCH_OBSERVER", "").strip().lower() == "python":
        return False, "Python dispatch mode: UVMPREFETCH_OBSERVER=python"
    ok, detail = native_observer.status()
    if ok:
        return True, f"C++ (RecordFunction): {detail}"
    try:
        key, facts = build_key(OBSERVER)
    except (NativeBuildError, ImportError, OSError) as e:
        return False, f"Python dispatch mode (the C++ observer cannot be built: {e})"
    if shutil.which("make") is None:
        return False, "Python dispatch mode (the C++ observer needs `make` to build)"
    return True, (f"C++ (RecordFunction), not built yet: the first run builds it for torch {facts['torch']} "
                  f"({facts['compiler'].split()[-1] if facts['compiler'] else 'c++'}) into {folder_for(OBSERVER, key)}")


def _tracker() -> tuple[bool, str]:
    """Whether the observer library carries the CUDA caching allocator's tracker (discards need it), and why not."""
    from ..runtime.native import OBSERVER, NativeBuildError, build_key
    try:
        _, facts = build_key(OBSERVER)
    except (NativeBuildError, ImportError, OSError) as e:
        return False, f"not built (the observer library cannot be built: {e}); UVMPREFETCH_DISCARD=1 discards nothing"
    if facts.get("cuda_include"):
        return True, (f"compiled into the observer library for torch {facts['torch']} (CUDA headers: "
                      f"{facts['cuda_include']}); attached at start-up with UVMPREFETCH_DISCARD=1")
    return False, (f"not built: torch {facts['torch']} has no libc10_cuda.so or no CUDA runtime headers were found; "
                   "UVMPREFETCH_DISCARD=1 discards nothing")


def _hook_installed() -> str:
    import site
    for d in site.getsitepackages() + [site.getusersitepackages()]:
        p = os.path.join(d, "uvmprefetch-startup.pth")
        if os.path.isfile(p):
            return f"installed: {p}"
    return ""


def run(args) -> int:
    res = checks()
    ready = all(c["ok"] for c in res if c["required"])
    if args.json:
        from . import emit_json
        emit_json({"checks": res, "cuda_ready": ready})
    else:
        w = max(len(c["name"]) for c in res)
        for c in res:
            state = "ok" if c["ok"] else ("missing" if c["required"] else "optional")
            print(f"{c['name']:<{w}}  {state:<8} {c['detail']}")
        print(f"cuda backend: {'ready' if ready else 'not available here'}; dryrun backend: "
              f"{'ready' if any(c['name'] == 'torch' and c['ok'] for c in res) else 'needs torch'}",
              file=sys.stdout)
    return 0 if ready else 1
