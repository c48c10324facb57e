"""The standard traces: the set ``uvmprefetch bench`` replays by default, recorded on demand into a cache.

Each entry is a ``record_model`` call at a training shape someone would run: big enough that its footprint
exceeds a GPU's memory once oversubscribed, small enough to record in well under a minute and replay
quickly. Files are ``<cache>/<hash>/<name>.uvmt`` where the hash covers the recording arguments, ``RECORDER_VERSION``
and the installed torch and transformers versions (which decide the kernels and model code): a change of any
re-records instead of using a stale file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .recorder import RECORDER_VERSION

# name -> record_model keyword arguments. 5 iterations: iteration 0 allocates the optimizer state, and the
# caching-allocator model (sim/layout.py) reaches its fixed point only at iteration 2 (GPT-2, BERT, ResNet, ViT:
# iterations 2, 3 and 4 touch identical blocks launch for launch, while iteration 1 matches iteration 2 in 20-94 %
# of launches, measured) or 3 (T5, below). A learned policy needs one steady iteration to learn from and one to be
# measured on, so the last iteration (``steady_slowdown``) is the first that shows a training run's steady
# state; with 3 iterations no trace showed it.
STANDARD: dict[str, dict] = {
    "gpt2-large": dict(model="gpt2", config="large", batch=8, seq=1024, iters=5),
    "bert-large": dict(model="bert", config="large", batch=16, seq=512, iters=5),
    "resnet-152": dict(model="resnet", config="152", batch=64, image_size=224, iters=5),
    "vit-large": dict(model="vit", config="large", batch=64, image_size=224, iters=5),
    # an encoder-decoder: every decoder layer's cross-attention reads the encoder's output (a 512-token source,
    # a 128-token target). Its caching-allocator layout settles one iteration later than the others' (iterations
    # 3 and 4 touch identical blocks, 2 and 3 do not): 5 iterations still show one steady iteration learned from
    # an identical one. Records in about 10 s and replays in about a fifth of the set's bench time.
    "t5-base": dict(model="t5", config="base", batch=32, seq=512, target_seq=128, iters=5),
}


def cache_dir(directory: str | Path | None = None) -> Path:
    """``directory``, else ``$UVMPREFETCH_TRACE_DIR``, else ``~/.cache/uvmprefetch/traces``."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get("UVMPREFETCH_TRACE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "uvmprefetch" / "traces"


def trace_path(name: str, directory: str | Path | None = None) -> Path:
    """Where the standard trace ``name`` lives (whether or not it was recorded yet)."""
    kw = STANDARD[name]
    key = {"kw": kw, "recorder": RECORDER_VERSION, "libs": _lib_versions()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    return cache_dir(directory) / digest.hexdigest()[:12] / f"{name}.uvmt"


def _lib_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for lib in ("torch", "transformers"):
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = None
    return out


def standard_traces(directory: str | Path | None = None, progress: bool = True,
                    names: list[str] | None = None) -> list[Path]:
    """Paths of the standard traces, recording those missing from the cache first.

    Parameters
    ----------
    directory : path, optional
        Cache folder (see ``cache_dir``).
    progress : bool
        Progress bars on stderr while recording.
    names : list of str, optional
        A subset of ``STANDARD`` (default: all, in ``STANDARD``'s order).

    Raises
    ------
    ConfigError
        An unknown name, or a cache folder that cannot be created.
    """
    from ..errors import ConfigError
    from .format import save
    from .models import record_model

    names = list(STANDARD) if names is None else names
    bad = [n for n in names if n not in STANDARD]
    if bad:
        raise ConfigError(f"unknown standard trace(s) {', '.join(bad)}; valid: {', '.join(STANDARD)}")
    out = []
    for name in names:
        path = trace_path(name, directory)
        if not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"trace cache {path.parent}: cannot create ({e.strerror})") from None
            kw = dict(STANDARD[name])
            t = record_model(kw.pop("model"), kw.pop("config"), progress=progress, **kw)
            t.meta["name"] = name
            save(t, path)
        out.append(path)
    return out
