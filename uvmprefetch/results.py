"""Where benchmark results go: a fresh run folder for every run, and the baseline files the README quotes.

Every benchmark (``uvmprefetch bench``, ``bench/*.py``, ``bench/gpu/*.py``) writes a new run to ``--out``; without
it, to ``<benchmark>-<UTC date and time>/`` under the current directory (``run_dir``), and it prints that path at
the end. Nothing is written into the package's own tree unless asked: ``--update-baseline`` also stores the run's
figures in ``bench/baselines/<benchmark>.json`` of the source checkout (``update_baseline``), the one current
file per benchmark that the README and the docs quote (its history is in git).

A baseline file maps a *setting* (say ``h100-pcie`` or ``h100-pcie-cal live-sync no-discard`` for the replay
benchmark) to the latest payload measured in it; updating one setting leaves the others as they are.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .errors import ConfigError
from .jsonutil import json_default

# The source checkout this package sits in (an editable install); a wheel has no bench/ folder next to it.
CHECKOUT = Path(__file__).resolve().parent.parent
BASELINES = CHECKOUT / "bench" / "baselines"


def stamp() -> str:
    """The UTC date and time that names a run folder, e.g. ``20261127-084915``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def run_dir(out: str | os.PathLike | None, benchmark: str, *, create: bool = True) -> Path:
    """``out`` if given, else ``./<benchmark>-<stamp>/`` under the current directory; created unless told not to.

    Raises
    ------
    ConfigError
        The folder cannot be created (names it and why).
    """
    d = Path(out) if out is not None else Path.cwd() / f"{benchmark}-{stamp()}"
    if create:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--out {d}: cannot create the folder ({e.strerror or e})") from None
    return d


def baseline_path(benchmark: str, root: Path | None = None) -> Path:
    """``bench/baselines/<benchmark>.json`` of the source checkout (or under ``root``).

    Raises
    ------
    ConfigError
        The package is not installed from a source checkout (no ``bench/`` folder beside it).
    """
    base = Path(root) if root is not None else BASELINES
    if root is None and not (CHECKOUT / "bench").is_dir():
        raise ConfigError(f"--update-baseline: no source checkout here ({CHECKOUT} has no bench/ folder); the "
                          "baseline files live in a clone of the repository (pip install -e .)")
    return base / f"{benchmark}.json"


def read_object(path: Path, what: str = "a baseline file is a JSON object of settings") -> dict:
    """A JSON file whose top level is an object ({} when the file does not exist).

    Raises
    ------
    ConfigError
        The file is not JSON, or its top level is not an object (``what`` says what it should be).
    """
    path = Path(path)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: {what}")
    return data


def write_atomic(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON through a temporary file renamed over ``path``: an interrupted run never
    leaves half a file. OSError propagates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1, default=json_default) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_baseline(benchmark: str, setting: str, payload: dict, root: Path | None = None) -> Path:
    """Store ``payload`` as ``setting`` in ``bench/baselines/<benchmark>.json`` (other settings stay, the write is
    atomic); returns the path.

    Raises
    ------
    ConfigError
        An empty setting, no source checkout, or a file that cannot be read or written.
    """
    if not setting:
        raise ConfigError("--update-baseline: empty setting name")
    path = baseline_path(benchmark, root)
    data = read_object(path)
    data[setting] = payload
    try:
        write_atomic(path, dict(sorted(data.items())))
    except OSError as e:
        raise ConfigError(f"--update-baseline: cannot write {path} ({e.strerror or e})") from None
    return path


def add_arguments(p, benchmark: str) -> None:
    """``--out DIR`` and ``--update-baseline`` with the help every benchmark shares."""
    p.add_argument("--out", metavar="DIR", default=None,
                   help=f"folder for this run's files (default: ./{benchmark}-<UTC date-time>/)")
    p.add_argument("--update-baseline", action="store_true",
                   help=f"also store the figures in bench/baselines/{benchmark}.json of the source checkout "
                        "(the file the README quotes)")


def close_run(args, benchmark: str, setting: str, payload: dict, out: Path) -> str:
    """Store ``payload`` as the baseline's ``setting`` when ``--update-baseline`` asked for it; returns the lines a
    benchmark prints last (the baseline file, if written, and the run folder).

    Raises
    ------
    ConfigError
        As ``update_baseline``.
    """
    lines = []
    if getattr(args, "update_baseline", False):
        lines.append(f"baseline: {update_baseline(benchmark, setting, payload)}")
    lines.append(f"results: {out}")
    return "\n".join(lines)


def finish_run(args, benchmark: str, setting: str, payload: dict, out: Path, status: int = 0) -> int:
    """A benchmark's last step: prints ``close_run``'s lines and returns ``status`` (its exit status); a baseline
    that cannot be stored is one line on stderr and exit status 2."""
    try:
        print(close_run(args, benchmark, setting, payload, out))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return status
