"""``uvmprefetch record --script train.py``: record an unmodified training script on a machine with no GPU.

The script runs in this process under three layers:

1. ``cuda_as_meta()``: ``torch.cuda.is_available()`` says True (so the script picks ``cuda``), and every
   tensor the script puts on ``cuda`` (``.cuda()``, ``.to("cuda")``, ``device="cuda"``, the default device,
   ``torch.load(map_location="cuda")``) becomes a meta tensor: shapes and dtypes, no memory, no arithmetic.
   Reading a value back (``.item()``, ``float()``, ``bool()``, ``.cpu()``, ``.tolist()``, ``.numpy()``)
   gives a fake value (see ``FAKE_FLOAT``) so logging and loss checks still run.
2. The ``Recorder``: every kernel-launching op on meta tensors is recorded; each optimizer step ends an
   iteration, and after ``iters`` of them the script is stopped (``StopRecording``, a ``BaseException``, so
   the script's own ``except Exception`` does not swallow it).
3. ``runpy``: the script runs as ``__main__`` with ``sys.argv = [script, *args]``.

What cannot work is listed in ``docs/recording.md`` (values computed on the "GPU" are fake: data-dependent
control flow follows the fake values; CUDA streams/events/graphs, ``torch.compile``, autocast on cuda).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from pathlib import Path

from ..errors import ConfigError, RecordError

FAKE_FLOAT = 1.0  # what .item() of a floating meta tensor returns (a finite loss: "not NaN" checks pass)
FAKE_INT = 0


class StopRecording(BaseException):
    """Raised from the optimizer step hook once the requested iterations are recorded."""


def _is_cuda(d) -> bool:
    import torch

    if isinstance(d, torch.device):
        return d.type == "cuda"
    if isinstance(d, str):
        return d.split(":")[0] == "cuda"
    return False


def _map_device(d):
    import torch

    if _is_cuda(d):
        return torch.device("meta")
    return d


def _fake_value(t):
    import torch

    if t.dtype == torch.bool:
        return False
    return FAKE_FLOAT if t.is_floating_point() or t.is_complex() else FAKE_INT


def _host_copy(t):
    """A CPU tensor standing in for a meta tensor read back to the host (zeros)."""
    import torch

    return torch.zeros(t.shape, dtype=t.dtype, device="cpu")  # explicit: the default device may be "cuda"


@contextlib.contextmanager
def cuda_as_meta(gpu_name: str = "uvmprefetch recorder (meta)", memory_bytes: int = 80 << 30):
    """Make ``cuda`` mean ``meta`` inside the block (see the module docstring)."""
    import torch
    import torch.optim.optimizer as optim_mod
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    T = torch.Tensor
    readback_scalar = {T.item, T.__float__, T.__int__, T.__bool__, T.__index__}
    readback_tensor = {T.cpu, T.numpy, T.tolist}

    class CudaAsMeta(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func in readback_scalar and args and isinstance(args[0], T) and args[0].is_meta:
                v = _fake_value(args[0])
                return bool(v) if func is T.__bool__ else (float(v) if func is T.__float__ else
                                                            (int(v) if func in (T.__int__, T.__index__) else v))
            if func in readback_tensor and args and isinstance(args[0], T) and args[0].is_meta:
                host = _host_copy(args[0])
                return host.numpy() if func is T.numpy else host.tolist() if func is T.tolist else host
            if func is T.cuda:
                return args[0].to("meta", non_blocking=kwargs.get("non_blocking", False))
            if "device" in kwargs:
                kwargs["device"] = _map_device(kwargs["device"])
            if func is T.to:
                args = tuple(_map_device(a) for a in args)
                dev = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device))), None))
                if args[0].is_meta and dev is not None and torch.device(dev).type == "cpu":
                    host = _host_copy(args[0])
                    dtype = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
                    return host.to(dtype) if dtype is not None else host
            return func(*args, **kwargs)

    class Props:
        name = gpu_name
        total_memory = memory_bytes
        major, minor = 9, 0
        multi_processor_count = 114

    real_load = torch.load

    def load(f, map_location=None, *a, **kw):
        if _is_cuda(map_location) or (isinstance(map_location, str) and map_location == "cuda"):
            obj = real_load(f, *a, map_location="cpu", **kw)
            return tree_map(lambda x: x.to("meta") if isinstance(x, T) else x, obj)
        return real_load(f, map_location, *a, **kw)

    real_set_default = torch.set_default_device
    cuda_patches = {
        "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
        "set_device": lambda d: None, "synchronize": lambda d=None: None, "empty_cache": lambda: None,
        "get_device_name": lambda d=None: gpu_name, "get_device_properties": lambda d=None: Props(),
        "get_device_capability": lambda d=None: (9, 0), "is_bf16_supported": lambda *a, **k: True,
        "memory_allocated": lambda d=None: 0, "max_memory_allocated": lambda d=None: 0,
        "memory_reserved": lambda d=None: 0, "max_memory_reserved": lambda d=None: 0,
        "reset_peak_memory_stats": lambda d=None: None, "manual_seed": lambda s: None,
        "manual_seed_all": lambda s: None,
    }
    saved = {k: getattr(torch.cuda, k) for k in cuda_patches if hasattr(torch.cuda, k)}
    saved_foreach = optim_mod._get_foreach_kernels_supported_devices
    try:
        for k, v in cuda_patches.items():
            setattr(torch.cuda, k, v)
        torch.load = load
        torch.set_default_device = lambda d: real_set_default(_map_device(d))
        # PyTorch picks foreach AdamW/Adam/SGD for CUDA parameters: make meta parameters get the same kernels.
        optim_mod._get_foreach_kernels_supported_devices = lambda: [*saved_foreach(), "meta"]
        with CudaAsMeta():
            yield
    finally:
        for k, v in saved.items():
            setattr(torch.cuda, k, v)
        torch.load = real_load
        torch.set_default_device = real_set_default
        real_set_default(None)
        optim_mod._get_foreach_kernels_supported_devices = saved_foreach


def record_script(script: str | Path, args: list[str] | None = None, *, iters: int = 2, gpu: str = "h100-pcie",
                  progress: bool = False):
    """Run ``script`` with ``args`` and record ``iters`` optimizer steps of it.

    Returns
    -------
    Trace

    Raises
    ------
    ConfigError
        The script does not exist, or ``iters`` < 1.
    RecordError
        The script failed (the message has its last line), or it made no optimizer step.
    """
    from .recorder import Recorder

    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"--script {script}: no such file")
    if iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {iters}")

    def stop():
        raise StopRecording()

    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iters, desc=f"record {path.name}", unit="iter", leave=False, disable=None)
    rec = Recorder(device="meta", gpu=gpu, max_iters=iters, on_stop=stop, progress=bar,
                   meta={"script": path.name, "args": list(args or []), "name": path.stem})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a script that asks the hub for weights fails fast
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *(args or [])]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        with cuda_as_meta(), rec:
            runpy.run_path(str(path), run_name="__main__")
    except StopRecording:
        pass
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RecordError(f"script {path.name} exited with status {e.code} after {rec.steps} "
                              f"optimizer step(s)") from None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - any failure of the user's script is reported in one line
        msg = str(e).strip().splitlines()
        raise RecordError(f"script {path.name} failed after {rec.steps} optimizer step(s): "
                          f"{type(e).__name__}: {msg[0] if msg else ''}".rstrip(": ")) from e
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if bar is not None:
            bar.close()
    if rec.steps == 0:
        raise RecordError(f"script {path.name} made no optimizer step: nothing to record (iterations are "
                          "delimited by optimizer.step())")
    return rec.trace()
