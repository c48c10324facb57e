"""Parsing of human sizes ("20GiB", "1.5e9", "512MB") used by the CLI and the environment variables."""

from __future__ import annotations

import re

from .errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

SIZE_FORMS = "a byte count with an optional unit: 512MiB, 20GiB, 1.5GB, 3e9"


def parse_size(text: str, what: str = "size") -> int:
    """Parse ``text`` as a byte count. ``what`` names the parameter in the error.

    Raises
    ------
    ConfigError
        If ``text`` is not a positive size.
    """
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"{what}: {text!r} is not a size; expected {SIZE_FORMS}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ConfigError(f"{what}: {text!r} must be positive")
    return int(value)


def format_size(n: float) -> str:
    """``1536 -> '1.5 KiB'``; used in human-readable output only."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
