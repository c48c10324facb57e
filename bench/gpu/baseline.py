"""``bench/baselines/gpu.json``: the one file every GPU figure this project quotes lives in.

Layout (documented in ``docs/gpu-validation.md``, "The GPU baseline file")::

    {"<device name>": {"date", "commit", "driver", "torch",
                       "cases": [{"name", "model", "budget_bytes", "oversub", "policy", "discards", "iterations",
                                  "s_per_iter_median", "plain_s_per_iter", "losses_bit_equal_plain",
                                  "htod_gib_per_iter", "dtoh_gib_per_iter", "host_us_per_launch",
                                  "training_thread_wait_s", ...extra fields a script adds}],
                       "microbench": {"<name>": {...}}}}

One entry per device kind, holding its latest figures (history stays in git). Scripts that run in one GPU
session each add their own cases: a case replaces the case of the same name, other cases stay, and the
entry's date / commit / driver / torch become the latest writer's. A field a case did not measure is
``null``, never a guess: ``case()`` fills every schema field the caller did not give with ``None``.

A dry run (``--dry-run`` on a CPU) writes the same structure to ``out/gpu-dryrun/gpu.json`` so that the
committed baselines are never overwritten by fake numbers.
"""

from __future__ import annotations

import math
from pathlib import Path

from uvmprefetch.errors import ConfigError
from uvmprefetch.results import read_object, write_atomic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BASELINE = REPO / "bench" / "baselines" / "gpu.json"
DRYRUN_BASELINE = REPO / "out" / "gpu-dryrun" / "gpu.json"

# The per-case fields every case carries (null where not measured), in the order they are written.
CASE_FIELDS = ("name", "model", "budget_bytes", "oversub", "policy", "discards", "iterations",
               "s_per_iter_median", "plain_s_per_iter", "losses_bit_equal_plain", "htod_gib_per_iter",
               "dtoh_gib_per_iter", "host_us_per_launch", "training_thread_wait_s")
ENTRY_FIELDS = ("date", "commit", "driver", "torch")


class BaselineError(ValueError):
    """A case or file that does not follow the schema (names what is wrong)."""


def case(name: str, **fields) -> dict:
    """One case: every schema field present (``None`` where not given), then any extra fields in order.

    Raises
    ------
    BaselineError
        An empty name, or a float field that is NaN or infinite (JSON has no such number; say ``None``).
    """
    if not isinstance(name, str) or not name:
        raise BaselineError("a case needs a non-empty name")
    out = {"name": name}
    for f in CASE_FIELDS[1:]:
        out[f] = fields.pop(f, None)
    out.update(fields)
    for k, v in out.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise BaselineError(f"case {name!r}: field {k!r} is {v}; write None for a figure not measured")
    return out


def path_for(dry_run: bool, override: Path | None = None) -> Path:
    """Where a script writes: ``override`` if given, else the committed file, or the dry-run copy."""
    if override is not None:
        return Path(override)
    return DRYRUN_BASELINE if dry_run else BASELINE


def load(path: Path) -> dict:
    """The file's content ({} when it does not exist).

    Raises
    ------
    BaselineError
        The file is not JSON, or not an object of device entries each with a ``cases`` list.
    """
    try:
        data = read_object(path, "top level must be an object of device entries")
    except ConfigError as e:
        raise BaselineError(str(e)) from None
    for dev, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("cases", []), list):
            raise BaselineError(f"{path}: entry {dev!r} must be an object with a 'cases' list")
        for c in entry.get("cases", []):
            if not isinstance(c, dict) or not c.get("name"):
                raise BaselineError(f"{path}: entry {dev!r} has a case without a name")
    return data


def update(path: Path, device: str, env: dict, cases: list[dict] = (), microbench: dict | None = None) -> dict:
    """Merge ``cases`` (by name) and ``microbench`` (by key) into ``device``'s entry and write the file.

    ``env`` is the script's ``_common.environment()``: its date, commit, driver and torch become the entry's.
    The write is atomic (a temporary file renamed over the old one). Returns the device's entry.
    """
    if not device:
        raise BaselineError("no device name: the environment did not say which GPU ran")
    path = Path(path)
    data = load(path)
    entry = data.get(device, {})
    entry.update({"date": env.get("date_utc"), "commit": env.get("commit"), "driver": env.get("driver"),
                  "torch": env.get("torch")})
    by_name = {c["name"]: c for c in entry.get("cases", [])}
    for c in cases:
        c = case(**c)
        by_name[c["name"]] = c
    entry["cases"] = sorted(by_name.values(), key=lambda c: c["name"])
    mb = dict(entry.get("microbench", {}))
    mb.update(microbench or {})
    entry["microbench"] = mb
    data[device] = {k: entry[k] for k in (*ENTRY_FIELDS, "cases", "microbench")}
    write_atomic(path, data)
    return data[device]


def annotate(path: Path, device: str, fields: dict[str, dict]) -> dict:
    """Add fields to existing cases of ``device`` (``{case name: {field: value}}``) and write the file, leaving the
    entry's date / commit / driver / torch as they are: for figures derived from the measurements on another
    machine (``fidelity.py --cases`` replays every case on a CPU). Returns the device's entry.

    Raises
    ------
    BaselineError
        The device or a named case is not in the file.
    """
    path = Path(path)
    data = load(path)
    if device not in data:
        raise BaselineError(f"{path}: no entry {device!r}")
    by_name = {c["name"]: c for c in data[device].get("cases", [])}
    for name, extra in fields.items():
        if name not in by_name:
            raise BaselineError(f"{path}: {device!r} has no case {name!r}")
        case(name, **extra)  # (the same checks as a new case: no NaN or infinite figure)
        by_name[name].update(extra)
    write_atomic(path, data)
    return data[device]
