"""The start-up hook: ``UVMPREFETCH=1`` in any Python process.

``uvmprefetch-startup.pth`` (installed into site-packages by ``setup.py``) runs ``hook()`` while Python
starts, only when ``UVMPREFETCH`` is set, so an unset variable costs one environment lookup. ``hook()``:

1. validates every ``UVMPREFETCH_*`` variable (an invalid one: one line on stderr, exit 2);
2. for the cuda backend, checks the GPU and cuda-python (missing: one line, exit 5), builds the shim and
   re-executes the interpreter with the shim in ``LD_PRELOAD`` (``sys.orig_argv`` is already set while
   ``.pth`` files run), so that PyTorch's ``cudaMalloc`` calls land in managed memory from the first one;
   ``PYTORCH_CUDA_ALLOC_CONF`` expandable segments are switched off because they allocate through driver
   VMM calls the shim does not see;
3. starts the runtime (``uvmprefetch.runtime.enable``).

Only the process that the user started runs the runtime: it records its pid in ``UVMPREFETCH_OWNER``, and
its children (DataLoader workers, subprocesses) inherit the variable and stay plain. The shim is removed
from the children's ``LD_PRELOAD`` too. Under a launcher (torchrun) the launcher does nothing and every rank
owns its runtime on its own device (``ranks.py``).
"""

from __future__ import annotations

import os
import sys


def _say(msg: str) -> None:
    sys.stderr.write(f"uvmprefetch: {msg}\n")
    sys.stderr.flush()


_ran = False


def hook() -> None:
    """Run at interpreter start-up; never raises (an error ends the process with one line and its code).

    Runs once per interpreter. On the H100 machine the hook ran a second time while the runtime was starting
    (the ``.pth`` file read again during an import: one pid re-executed itself ~25 times in 200 s, each time
    just after the runtime's import of ``cupti``); that run found ``LD_PRELOAD`` already cleaned for the
    children and re-executed the process, forever."""
    global _ran
    if _ran:
        return
    _ran = True
    from ..errors import UvmPrefetchError
    try:
        _hook()
    except UvmPrefetchError as e:
        _say(f"error: {e}")
        os._exit(e.exit_code)
    except Exception as e:  # noqa: BLE001 - start-up must never print a traceback
        if os.environ.get("UVMPREFETCH_LOG", "").lower() == "debug":
            raise
        _say(f"internal error at start-up: {type(e).__name__}: {e} (set UVMPREFETCH_LOG=debug for the traceback)")
        os._exit(70)


def _argv() -> list[str]:
    return list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])


def _is_uvmprefetch_cli() -> bool:
    """Is this process the ``uvmprefetch`` command itself? (it must not observe itself: ``run`` starts the child
    with the runtime on)."""
    from .ranks import program_of
    kind, name = program_of(_argv())
    return (kind == "-m" and name.split(".")[0] == "uvmprefetch") or (kind == "script" and name == "uvmprefetch")


def _hook() -> None:
    from ..config import from_env
    cfg = from_env()
    if not cfg.enabled or _is_uvmprefetch_cli():
        return
    from .ranks import claim, role_of
    role = role_of(os.environ, os.getpid(), _argv())  # launchers and the children of an owner stay plain
    if role.note:
        _say(role.note)
    if role.kind == "plain":
        claim(os.environ, os.getpid(), role)
    if role.kind != "owner":
        return
    if cfg.backend == "cuda":
        from .device import require_cuda
        drv = require_cuda()
        if role.rank is not None and not _rank_has_device(role, drv.devices):
            return
        from .shim import LIB_NAME, preloaded, remember_preloaded, shim_path
        path = preloaded()
        if path is None:
            _reexec_with_shim(str(shim_path()), role)
        remember_preloaded(path)
        # children must not inherit the shim (a worker allocating on the GPU would be redirected unbooked)
        parts = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split()
                 if os.path.basename(p) != LIB_NAME]
        if parts:
            os.environ["LD_PRELOAD"] = " ".join(parts)
        else:
            os.environ.pop("LD_PRELOAD", None)
    claim(os.environ, os.getpid(), role)
    from . import enable
    enable(cfg)


def _rank_has_device(role, visible: int) -> bool:
    """A rank whose device cannot be named runs plain (one line), its children too; the other ranks go on."""
    from ..errors import DeviceError
    from .ranks import claim, device_index
    try:
        device_index(role.rank, visible)
        return True
    except DeviceError as e:
        _say(f"{e}; this rank runs without uvmprefetch")
        claim(os.environ, os.getpid(), role)
        return False


def alloc_conf_without_expandable(conf: str) -> tuple[str, bool]:
    """``PYTORCH_CUDA_ALLOC_CONF`` with expandable segments forced off; True if it changed.

    Raises
    ------
    DeviceError
        If the conf selects the ``cudaMallocAsync`` backend (it never calls ``cudaMalloc``).
    """
    from ..errors import DeviceError
    items = [p.strip() for p in conf.replace(";", ",").split(",") if p.strip()]
    out, changed = [], False
    for it in items:
        k, _, v = it.partition(":")
        if k.strip() == "backend" and v.strip() == "cudaMallocAsync":
            raise DeviceError("PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync, which bypasses cudaMalloc; "
                              "uvmprefetch needs PyTorch's native caching allocator")
        if k.strip() == "expandable_segments":
            changed = changed or v.strip().lower() == "true"
            continue
        out.append(it)
    out.append("expandable_segments:False")
    return ",".join(out), changed


def _reexec_with_shim(path: str, role) -> None:
    from .ranks import claim
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [path, env.get("LD_PRELOAD", "")]))
    claim(env, os.getpid(), role)  # execve keeps the pid
    conf, changed = alloc_conf_without_expandable(env.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    if changed:
        _say("expandable segments switched off (they allocate through driver calls the shim cannot see)")
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    argv = _argv()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
