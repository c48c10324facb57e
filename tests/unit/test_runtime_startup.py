"""Enablement: the start-up hook (``UVMPREFETCH=1`` in any Python process), ``uvmprefetch run`` and
``uvmprefetch.enable``; invalid values and a missing GPU give one clear line and a non-zero exit."""

import json
import os
import subprocess
import sys

import pytest

from uvmprefetch.runtime.startup import alloc_conf_without_expandable
from uvmprefetch.errors import DeviceError

HAVE_GPU = os.path.exists("/dev/nvidiactl")


def py(code, env_extra, timeout=120):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def one_line(stderr):
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_unset_costs_nothing():
    # GIVEN no UVMPREFETCH, THEN the hook imports nothing of ours (one environment lookup)
    r = py("import sys; print(any(m.split('.')[0] == 'uvmprefetch' for m in sys.modules))", {})
    assert r.returncode == 0 and r.stdout.strip() == "False"
    r = py("import sys; print('uvmprefetch.runtime.session' in sys.modules)", {"UVMPREFETCH": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False"  # set but off: config checked, runtime not started


@pytest.mark.parametrize("var,value", [("UVMPREFETCH", "maybe"), ("UVMPREFETCH_BUDGET", "lots"),
                                       ("UVMPREFETCH_BACKEND", "tpu"), ("UVMPREFETCH_WINDOW", "-3"),
                                       ("UVMPREFETCH_POLICY", "nope"), ("UVMPREFETCH_POLICY", "oracle"),
                                       ("UVMPREFETCH_MANAGED_LIMIT", "lots"), ("UVMPREFETCH_SHIM_LIMIT", "1000"),
                                       ("UVMPREFETCH_OBSERVER", "cpp"),
                                       ("UVMPREFETCH_WINDOW", "8")])  # demand has no window
def test_invalid_value_one_line_exit_2(var, value):
    env = {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_POLICY": "demand", var: value}
    r = py("print('the program ran')", env)
    assert r.returncode == 2 and "the program ran" not in r.stdout
    line = one_line(r.stderr)
    assert var in line and ("accepted" in line or "valid" in line or "policy" in line)


@pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU refusal")
def test_missing_gpu_one_line_exit_5():
    r = py("print('the program ran')", {"UVMPREFETCH": "1"})  # backend defaults to cuda
    assert r.returncode == 5 and "the program ran" not in r.stdout
    assert "GPU" in one_line(r.stderr)
    r = subprocess.run(["uvmprefetch", "run", "--", sys.executable, "-c", "print(1)"], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")})
    assert r.returncode == 5 and r.stdout == "" and "GPU" in one_line(r.stderr)


def test_hook_enables_runtime_in_owner_only(tmp_path):
    rep = tmp_path / "r.json"
    code = "import torch; x = torch.ones(4); (x * 2).sum()"
    # (a trace keeps the planner awake: without one it would sleep through a program this small, launches unseen)
    env = {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_REPORT": str(rep),
           "UVMPREFETCH_LOG": "quiet", "UVMPREFETCH_TRACE": str(tmp_path / "t.uvmt")}
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(rep.read_text())["launches"] >= 2
    rep.unlink()
    r = py(code, {**env, "UVMPREFETCH_OWNER": "1"})  # a child of another run: stays plain
    assert r.returncode == 0 and not rep.exists()


def test_observer_native_where_it_cannot_be_used_is_one_line_exit_2(tmp_path):
    # GIVEN a cache the builder may not use (someone else's folder): the C++ observer cannot be built here
    import os as _os
    if _os.geteuid() != 0:
        pytest.skip("needs root to hand the cache folder to another owner")
    cache = tmp_path / "cache"
    cache.mkdir()
    _os.chown(cache, 12345, 12345)
    env = {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_CACHE_DIR": str(cache)}
    code = "import torch; print((torch.ones(3) * 2).sum().item())"
    # WHEN it is required, THEN one line naming the variable and the reason, exit 2, the program never runs
    r = py(code, {**env, "UVMPREFETCH_OBSERVER": "native"})
    assert r.returncode == 2 and "6.0" not in r.stdout
    line = one_line(r.stderr)
    assert "UVMPREFETCH_OBSERVER=native" in line and "not private" in line
    # WHEN it is only preferred (auto), THEN the Python observer runs and one line says why
    r = py(code, env)
    assert r.returncode == 0 and r.stdout.strip() == "6.0"
    said = [ln for ln in r.stderr.splitlines() if "observer: Python dispatch mode" in ln]
    assert len(said) == 1 and "not private" in said[0]


def test_run_cli_dryrun(tmp_path):
    rep = tmp_path / "r.json"
    r = subprocess.run(["uvmprefetch", "run", "--backend", "dryrun", "--budget", "16MiB", "--report", str(rep),
                        "--trace", str(tmp_path / "t.uvmt"),  # (a trace keeps the planner awake: every launch)
                        "--log", "quiet", "--", sys.executable, "-c",
                        "import torch; a = torch.randn(1024, 1024); b = (a @ a).relu().sum(); print(float(b) > 0)"],
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"
    d = json.loads(rep.read_text())
    assert d["budget_bytes"] == 16 << 20 and d["launches"] >= 3 and not d["degraded"]


def test_run_cli_bad_flag_one_line():
    r = subprocess.run(["uvmprefetch", "run", "--backend", "dryrun", "--window", "zero", "--", "python", "-c", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "UVMPREFETCH_WINDOW" in one_line(r.stderr)


def test_enable_api_in_process(tmp_path):
    code = f"""
import uvmprefetch, torch, json
s = uvmprefetch.enable(backend="dryrun", budget="8MiB", log="quiet", report={str(tmp_path / 'e.json')!r})
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for _ in range(2):
    loss = m(torch.randn(64, 256)).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
print(loss.item().hex())
rep = uvmprefetch.disable()
print(json.dumps([rep["iterations"], rep["launches_by_phase"]["backward"] > 0]))
"""
    r = py(code, {})
    assert r.returncode == 0, r.stderr
    loss_hex, summary = r.stdout.splitlines()
    assert json.loads(summary) == [2, True]
    plain = py(code.replace("s = uvmprefetch.enable(", "s = dict(").replace("rep = uvmprefetch.disable()",
                                                                             "rep = dict(iterations=2, launches_by_phase={'backward': 1})"), {})
    assert plain.stdout.split()[0] == loss_hex


def test_alloc_conf_rewrite():
    assert alloc_conf_without_expandable("") == ("expandable_segments:False", False)
    conf, changed = alloc_conf_without_expandable("max_split_size_mb:128,expandable_segments:True")
    assert changed and conf == "max_split_size_mb:128,expandable_segments:False"
    with pytest.raises(DeviceError):
        alloc_conf_without_expandable("backend:cudaMallocAsync")


def test_the_cli_never_observes_itself():
    # UVMPREFETCH=1 in the shell must not switch the runtime on inside `uvmprefetch ...` (no GPU needed here)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["UVMPREFETCH"] = "1"
    for cmd in (["uvmprefetch", "doctor", "--json"], [sys.executable, "-m", "uvmprefetch", "doctor", "--json"]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode in (0, 1), r.stderr
        d = json.loads(r.stdout)
        names = {c["name"] for c in d["checks"]}
        assert {"nvidia driver", "gpu", "concurrent managed access", "batched prefetch/discard", "cuda-python",
                "cupti", "shim", "torch"} <= names
        assert all(c["detail"] for c in d["checks"])  # every line says why
        assert d["cuda_ready"] == (r.returncode == 0)
        if not HAVE_GPU:
            assert not d["cuda_ready"] and not next(c for c in d["checks"] if c["name"] == "gpu")["ok"]


def test_run_cli_json_last_line(tmp_path):
    r = subprocess.run(["uvmprefetch", "run", "--json", "--backend", "dryrun", "--log", "quiet",
                        "--trace", str(tmp_path / "t.uvmt"), "--", sys.executable,
                        "-c", "import torch; print('child'); (torch.ones(4) + 1).sum()"],
                       capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")})
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0] == "child"
    d = json.loads(lines[-1])
    assert d["returncode"] == 0 and d["report"]["backend"] == "dryrun" and d["report"]["launches"] >= 2


def test_hook_runs_once_per_interpreter(monkeypatch):
    # GIVEN a package that makes Python read the .pth again (site.addsitedir on site-packages, seen on a GPU
    # machine), THEN the second run does nothing: it would find LD_PRELOAD cleaned for the children and
    # re-execute the process, forever.
    import uvmprefetch.runtime.startup as st
    calls = []
    monkeypatch.setattr(st, "_ran", False)
    monkeypatch.setattr(st, "_hook", lambda: calls.append(1))
    st.hook()
    st.hook()
    assert calls == [1]


def test_preloaded_survives_cleaning_ld_preload(monkeypatch):
    # GIVEN the hook saw the shim preloaded and took it out of LD_PRELOAD for the children,
    # THEN the backend still learns that it was preloaded (not the late RTLD_GLOBAL mode)
    import uvmprefetch.runtime.shim as sh
    monkeypatch.setattr(sh, "_started_with", None)
    monkeypatch.setenv("LD_PRELOAD", f"/x/{sh.LIB_NAME}")
    assert sh.preloaded() == f"/x/{sh.LIB_NAME}"
    monkeypatch.delenv("LD_PRELOAD")
    assert sh.preloaded() is None
    sh.remember_preloaded(f"/x/{sh.LIB_NAME}")
    assert sh.preloaded() == f"/x/{sh.LIB_NAME}"


@pytest.mark.parametrize("importable", [True, False])
def test_the_pth_hook_says_one_line_when_the_package_cannot_be_imported(tmp_path, importable):
    # GIVEN the start-up hook's .pth in a site directory and UVMPREFETCH set, WHEN Python reads it with the package
    # importable (set but off: nothing to say) or not (a broken install: an editable one whose source is gone),
    # THEN the process goes on and says at most one line naming the cause, never a traceback
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "uvmprefetch-startup.pth").write_text((root / "uvmprefetch" / "runtime" /
                                                      "uvmprefetch-startup.pth").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH") and k != "PYTHONPATH"}
    env["UVMPREFETCH"] = "0"
    if importable:
        env["PYTHONPATH"] = str(root)
    r = subprocess.run([sys.executable, "-S", "-c", f"import site; site.addsitedir({str(site_dir)!r}); print('ran')"],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    assert "Traceback" not in r.stderr and "Error processing" not in r.stderr, r.stderr
    if importable:
        assert r.stderr.strip() == ""
    else:
        line = one_line(r.stderr)
        assert line.startswith("uvmprefetch: UVMPREFETCH is set but the package cannot be imported (No module")
