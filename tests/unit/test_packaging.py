"""Packaging: GIVEN an environment that already has a torch >= 2.9 other than the one the README installs (say a CUDA
build) WHEN ``pip install -e .`` runs THEN pip keeps that torch; the requirement is a range, and the installed torch
satisfies it.

The pip check is real: pip's own resolver, in a fresh virtual environment over this interpreter's packages, asked
what it would install (``--dry-run --report``). The one stand-in is the other torch: the metadata of a
``2.10.0+cu130`` distribution (a CUDA build is several GB and cannot be installed here), which is all pip reads to
decide whether an installed distribution satisfies a requirement. The same check with the old exact pin
(``torch==2.13.0``) shows pip replacing it, so the check can fail."""

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
OTHER_TORCH = "2.10.0+cu130"


def torch_requirement(pyproject: Path) -> Requirement:
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    return req


def test_torch_is_a_range_the_installed_torch_satisfies():
    import torch
    req = torch_requirement(REPO / "pyproject.toml")
    assert all(s.operator in (">=", ">") for s in req.specifier), f"torch must be a lower bound only, got {req}"
    assert req.specifier.contains(torch.__version__, prereleases=True)
    assert req.specifier.contains(OTHER_TORCH) and not req.specifier.contains("2.8.0")


@pytest.fixture(scope="module")
def env_with_other_torch(tmp_path_factory):
    """A venv that sees this interpreter's packages (pip, setuptools, the other dependencies: a .pth file lists
    their folders, after the venv's own) and whose own site-packages holds torch 2.10.0+cu130's metadata."""
    d = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(d)
    py = d / "bin" / "python"
    site = Path(subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    outer = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()]
    (site / "outer-packages.pth").write_text("\n".join(outer) + "\n")
    info = site / f"torch-{OTHER_TORCH}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {OTHER_TORCH}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    return py


def project_copy(dst: Path, torch_spec: str | None = None) -> Path:
    """The files ``pip install -e .`` reads, copied (the build writes egg-info beside them)."""
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, dst / name)
    shutil.copytree(REPO / "uvmprefetch", dst / "uvmprefetch", ignore=shutil.ignore_patterns("__pycache__"))
    if torch_spec is not None:
        text = (dst / "pyproject.toml").read_text()
        (dst / "pyproject.toml").write_text(re.sub(r'"torch[^"]*"', f'"{torch_spec}"', text, count=1))
    return dst


def would_install(py: Path, project: Path, report: Path) -> dict:
    """{name: version} that ``pip install -e project`` would install into the venv, nothing fetched from a network."""
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    p = subprocess.run([py, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--report", str(report),
                        "-e", str(project)], env=env, capture_output=True, text=True, timeout=300, cwd=project)
    out = p.stdout + p.stderr
    return {"rc": p.returncode, "out": out,
            "install": {i["metadata"]["name"].lower(): i["metadata"]["version"]
                        for i in json.loads(report.read_text())["install"]} if report.exists() else None}


def test_pip_install_e_keeps_an_installed_torch(env_with_other_torch, tmp_path):
    got = would_install(env_with_other_torch, project_copy(tmp_path), tmp_path / "report.json")
    assert got["rc"] == 0, got["out"][-2000:]
    assert set(got["install"]) == {"uvmprefetch"}, got["install"]  # torch (and every other dependency) kept
    check = subprocess.run([env_with_other_torch, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           capture_output=True, text=True)
    assert check.stdout.strip() == OTHER_TORCH


def test_an_exact_pin_would_have_replaced_it(env_with_other_torch, tmp_path):
    """The control: the same environment and command with ``torch==2.13.0`` plans to replace the installed torch
    (or, where no 2.13.0 wheel is at hand, fails to resolve): either way it would not keep it."""
    got = would_install(env_with_other_torch, project_copy(tmp_path, "torch==2.13.0"), tmp_path / "report.json")
    if got["rc"] == 0:
        assert got["install"].get("torch", "").startswith("2.13.0"), got["install"]
    else:
        assert re.search(r"No matching distribution found for torch==2\.13\.0", got["out"]), got["out"][-2000:]
