"""The shared-GPU rule (docs/design.md §5) in our own GPU checks: every process that ``bench/gpu/*.py`` and
``tests/gpu/*`` start gets ``UVMPREFETCH_MANAGED_LIMIT=gpu-free`` (never more managed memory than the card has
free; pressure comes from the budget), although the product's default lets managed memory grow to what the
host can back.

GIVEN the scripts' source, WHEN every call that starts a process is found (``subprocess.*``, ``os.exec*``,
``os.spawn*``, ``os.system``, ``os.popen``, ``multiprocessing``), THEN each passes ``env=child_env(...)`` (the
one place that sets the rule, ``bench/gpu/_common.py``), and ``child_env`` sets it over anything else;
``run_all.sh`` exports it for what it starts itself.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
import _common as C  # noqa: E402

SCRIPTS = sorted([*(REPO / "bench" / "gpu").glob("*.py"), *(REPO / "tests" / "gpu").glob("*.py")])
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
OS_STARTS = re.compile(r"^(exec\w*|spawn\w*|system|popen|posix_spawn\w*|fork\w*)$")


def _dotted(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def process_starts(tree) -> list[ast.Call]:
    """Calls that start a process, however the module was imported (``subprocess.run``, ``sp.Popen``, a bare
    ``run`` imported from subprocess, ``os.execve``, ``multiprocessing.Process``...)."""
    from_subprocess = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       and n.module == "subprocess" for a in n.names}
    mods = {"subprocess"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                             if a.name == "subprocess" and a.asname}
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        name = _dotted(n.func)
        head, _, last = name.rpartition(".")
        if ((head in mods and last in SUBPROCESS) or (not head and last in from_subprocess & SUBPROCESS)
                or (head == "os" and OS_STARTS.match(last)) or head.startswith("multiprocessing")
                or head.startswith("asyncio") and last.startswith("create_subprocess")):
            out.append(n)
    return sorted(out, key=lambda c: (c.lineno, c.col_offset))


def env_from_child_env(call: ast.Call) -> bool:
    env = next((k.value for k in call.keywords if k.arg == "env"), None)
    return isinstance(env, ast.Call) and _dotted(env.func).rpartition(".")[2] == "child_env"


def test_every_child_of_a_gpu_script_or_gpu_test_gets_its_environment_from_child_env():
    assert any(p.name == "_common.py" for p in SCRIPTS) and any(p.parent.name == "gpu" and p.name.startswith("test_")
                                                                 for p in SCRIPTS)
    found, bad = 0, []
    for path in SCRIPTS:
        tree = ast.parse(path.read_text(), str(path))
        for call in process_starts(tree):
            found += 1
            if not env_from_child_env(call):
                bad.append(f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)[:100]}")
    assert not bad, "processes started without env=child_env(...) (UVMPREFETCH_MANAGED_LIMIT=gpu-free):\n" + \
        "\n".join(bad)
    assert found >= 4  # _common.py's two (nvidia-smi/git, the training worker), test_runtime_gpu.py's two


def test_the_checker_sees_the_ways_a_process_is_started():
    src = """
import os, subprocess as sp
from subprocess import Popen
import multiprocessing
sp.run(["x"], env=dict(os.environ))
Popen(["x"])
os.execve("/bin/x", ["x"], {})
multiprocessing.Process(target=print).start()
sp.run(["x"], env=C.child_env({"A": "1"}))
"""
    calls = process_starts(ast.parse(src))
    assert [env_from_child_env(c) for c in calls] == [False, False, False, False, True]


def test_child_env_sets_gpu_free_over_anything_else(monkeypatch):
    monkeypatch.setenv("UVMPREFETCH_MANAGED_LIMIT", "host")
    monkeypatch.setenv("UVMPREFETCH_BUDGET", "1GiB")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = C.child_env({"UVMPREFETCH_MANAGED_LIMIT": "200GiB", "UVMPREFETCH": "1"})
    assert env["UVMPREFETCH_MANAGED_LIMIT"] == "gpu-free" and env["UVMPREFETCH"] == "1"
    assert "UVMPREFETCH_BUDGET" not in env and env["SOMETHING_ELSE"] == "kept"  # the caller's runtime vars go
    env = C.child_env(base={"UVMPREFETCH_MANAGED_LIMIT": "host", "PATH": os.environ.get("PATH", "")})
    assert env["UVMPREFETCH_MANAGED_LIMIT"] == "gpu-free"
    from uvmprefetch.config import from_env
    assert from_env(env).managed_limit.mode == "gpu-free"  # a value the runtime accepts


def test_run_all_exports_gpu_free_before_it_starts_anything():
    text = (REPO / "bench" / "gpu" / "run_all.sh").read_text()
    lines = [ln.strip() for ln in text.splitlines()]
    export = lines.index("export UVMPREFETCH_MANAGED_LIMIT=gpu-free")
    first_start = min(i for i, ln in enumerate(lines) if ln.startswith(("setup()", "step()", 'case "$PART"')))
    assert export < first_start
    assert not [ln for ln in lines if "UVMPREFETCH_MANAGED_LIMIT=" in ln and "gpu-free" not in ln]


@pytest.mark.parametrize("script", ["diagnose"])
def test_a_policy_spec_cannot_lift_the_limit(script):
    import importlib
    mod = importlib.import_module(script)
    from uvmprefetch.errors import ConfigError
    with pytest.raises(ConfigError, match="UVMPREFETCH_MANAGED_LIMIT=host"):
        mod.parse_spec("demand|UVMPREFETCH_MANAGED_LIMIT=host")
