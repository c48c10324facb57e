"""UVMPREFETCH_* parsing: every variable validated, one clear error naming it (`docs/design.md` §4)."""

import pytest

from uvmprefetch.config import (Budget, ManagedLimit, RuntimeConfig, from_env, parse_budget, parse_managed_limit,
                                parse_window)
from uvmprefetch.errors import ConfigError


def test_defaults_when_unset():
    cfg = from_env({})
    assert cfg == RuntimeConfig()
    assert not cfg.enabled and cfg.backend == "cuda" and cfg.budget is None and cfg.window is None


@pytest.mark.parametrize("text,expect", [
    ("20GiB", Budget(nbytes=20 * 1024**3)),
    ("512MB", Budget(nbytes=512 * 10**6)),
    ("3e9", Budget(nbytes=3 * 10**9)),
    ("0.5", Budget(fraction=0.5)),
    ("50%", Budget(fraction=0.5)),
    ("1", Budget(fraction=1.0)),
    ("1048576", Budget(nbytes=1048576)),
])
def test_budget_forms(text, expect):
    assert parse_budget(text) == expect


def test_budget_resolve():
    assert Budget(fraction=0.25).resolve(8 << 30) == 2 << 30
    assert Budget(nbytes=123).resolve(8 << 30) == 123


@pytest.mark.parametrize("var,value", [
    ("UVMPREFETCH", "maybe"),
    ("UVMPREFETCH_BACKEND", "rocm"),
    ("UVMPREFETCH_BUDGET", "lots"),
    ("UVMPREFETCH_BUDGET", "-1GiB"),
    ("UVMPREFETCH_BUDGET", "150%"),
    ("UVMPREFETCH_BUDGET", "2.5"),
    ("UVMPREFETCH_WINDOW", "0"),
    ("UVMPREFETCH_WINDOW", "wide"),
    ("UVMPREFETCH_LOG", "loud"),
    ("UVMPREFETCH_REPORT", "/no/such/folder/report.json"),
    ("UVMPREFETCH_TRACE", "/no/such/folder/run.uvmt"),
    ("UVMPREFETCH_POLICY", "no-such-policy"),
    ("UVMPREFETCH_GPU", "voodoo5"),
    ("UVMPREFETCH_DISCARD", "sometimes"),
    ("UVMPREFETCH_MANAGED_LIMIT", "lots"),
    ("UVMPREFETCH_MANAGED_LIMIT", "0.5"),  # a bare number is bytes, never a fraction: 0 bytes
    ("UVMPREFETCH_MANAGED_LIMIT", "-2GiB"),
    ("UVMPREFETCH_MANAGED_LIMIT", "1e30"),  # beyond 64 bits
])
def test_invalid_value_names_the_variable(var, value):
    with pytest.raises(ConfigError) as e:
        from_env({"UVMPREFETCH": "1", var: value})
    msg = str(e.value)
    assert var in msg and "\n" not in msg
    assert "accepted" in msg or "valid" in msg


def test_window_forms():
    assert parse_window("auto") is None and parse_window("") is None and parse_window("16") == 16


def test_env_round_trip(tmp_path):
    cfg = from_env({"UVMPREFETCH": "yes", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": "0.25",
                    "UVMPREFETCH_WINDOW": "8", "UVMPREFETCH_REPORT": str(tmp_path / "r.json"),
                    "UVMPREFETCH_LOG": "info", "UVMPREFETCH_DISCARD": "on"})
    assert cfg.enabled and cfg.backend == "dryrun" and cfg.budget == Budget(fraction=0.25) and cfg.window == 8
    assert cfg.discard
    assert from_env(cfg.to_env()) == cfg
    for limit in ("gpu-free", "200GiB", "host"):
        cfg = from_env({"UVMPREFETCH": "1", "UVMPREFETCH_MANAGED_LIMIT": limit})
        assert from_env(cfg.to_env()) == cfg


def test_discards_are_off_unless_asked_for():
    assert not from_env({"UVMPREFETCH": "1"}).discard and not RuntimeConfig().discard
    assert from_env({"UVMPREFETCH": "1", "UVMPREFETCH_DISCARD": "1"}).discard


@pytest.mark.parametrize("text,expect", [
    ("", ManagedLimit()), ("host", ManagedLimit()), (" Host ", ManagedLimit()),
    ("gpu-free", ManagedLimit("gpu-free")), ("GPU-FREE", ManagedLimit("gpu-free")),
    ("200GiB", ManagedLimit("bytes", 200 << 30)), ("1.5GB", ManagedLimit("bytes", 1_500_000_000)),
    ("3e9", ManagedLimit("bytes", 3 * 10**9)), ("1048576", ManagedLimit("bytes", 1 << 20)),
])
def test_managed_limit_forms(text, expect):
    assert parse_managed_limit(text) == expect


def test_managed_limit_defaults_to_host():
    assert from_env({}).managed_limit == ManagedLimit("host") == RuntimeConfig().managed_limit
    assert from_env({"UVMPREFETCH_MANAGED_LIMIT": "gpu-free"}).to_env()["UVMPREFETCH_MANAGED_LIMIT"] == "gpu-free"


def test_the_replaced_shim_limit_variable_is_refused_with_its_successor_named():
    with pytest.raises(ConfigError) as e:
        from_env({"UVMPREFETCH": "1", "UVMPREFETCH_SHIM_LIMIT": "1000000"})
    assert "UVMPREFETCH_SHIM_LIMIT" in str(e.value) and "UVMPREFETCH_MANAGED_LIMIT" in str(e.value)
