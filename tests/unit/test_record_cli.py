"""GIVEN the record/info commands WHEN run on zoo models, user scripts and bad input THEN they write valid
traces, report the documented JSON fields, and fail with one line and a non-zero exit code."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from uvmprefetch.cli import main
from uvmprefetch.trace import KIND, load

ROOT = Path(__file__).resolve().parents[2]
FIELDS = ("launches", "allocations", "iterations", "bytes_allocated", "peak_live_bytes", "param_bytes",
          "optimizer_bytes", "gradient_bytes", "activation_peak_bytes", "working_set_bytes", "ideal_s")


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "uvmprefetch", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_record_then_info_json(tmp_path, capsys):
    out = tmp_path / "g.uvmt"
    assert main(["record", "--model", "gpt2", "--config", "tiny", "--batch", "2", "--seq", "32", "--iters", "3",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["info", str(out), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for f in FIELDS:
        assert f in s, f
    t = load(out)
    assert s["launches"] == t.n_launches and s["iterations"] == 3
    assert {"h100-pcie", "a100-pcie", "v100-pcie"} <= set(s["ideal_s"])
    assert s["ideal_s"]["v100-pcie"] > s["ideal_s"]["h100-pcie"] > 0
    p = 4 * t.meta["params"]
    assert s["param_bytes"] == p and s["gradient_bytes"] == p and s["optimizer_bytes"] == 2 * p
    # steady state touches everything live at its peak, never more than the bytes that were ever allocated
    assert p <= s["working_set_bytes"] <= s["bytes_allocated"]
    assert s["peak_live_bytes"] <= s["param_bytes"] + s["optimizer_bytes"] + s["gradient_bytes"] + \
        s["activation_peak_bytes"] + s["input_bytes"] + s["other_peak_bytes"]
    assert main(["info", str(out)]) == 0
    human = capsys.readouterr().out
    assert "optimizer state" in human and "h100-pcie" in human


@pytest.mark.parametrize("args,needle", [
    (["record", "--model", "gpt2", "--config", "huge"], "--config 'huge'"),
    (["record", "--model", "resnet", "--config", "50", "--seq", "128"], "--seq does not apply to resnet"),
    (["record", "--model", "gpt2", "--config", "small", "--seq", "4096"], "exceeds"),
    (["record", "--model", "gpt2", "--config", "small", "--target-seq", "64"], "--target-seq applies to encoder-dec"),
    (["record", "--model", "t5", "--config", "tiny", "--target-seq", "0"], "--target-seq must be a positive"),
    (["record", "--model", "t5", "--config", "xxl"], "--config 'xxl': unknown for t5"),
    (["record", "--model", "gpt2", "--gpu", "tpu9"], "unknown GPU profile 'tpu9'"),
    (["record", "--script", "does-not-exist.py"], "no such file"),
    (["info", "missing.uvmt"], "no such trace file"),
])
def test_bad_arguments_one_line_nonzero(tmp_path, monkeypatch, capsys, args, needle):
    monkeypatch.chdir(tmp_path)
    assert main(args) != 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_info_on_a_corrupt_file_is_one_line(tmp_path):
    p = tmp_path / "bad.uvmt"
    p.write_bytes(b"UVMTRACE\x01\x00\x00\x00")
    r = _cli("info", str(p))
    assert r.returncode == 3 and "truncated" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_record_unmodified_script(tmp_path):
    out = tmp_path / "me.uvmt"
    r = _cli("record", "--script", str(ROOT / "examples" / "record_me.py"), "--iters", "2", "-o", str(out),
             "--", "--steps", "6", "--seq", "32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the script ran: .item() on the loss gave a value it could print, and it was stopped after 2 steps
    assert "step 0 loss 1.0000" in r.stdout and "step 2" not in r.stdout
    t = load(out)
    assert t.iterations == 2 and t.meta["script"] == "record_me.py" and t.meta["args"] == ["--steps", "6", "--seq", "32"]
    names = set(t.names)
    assert "aten::_scaled_dot_product_efficient_attention" in names  # nn.MultiheadAttention on "cuda"
    assert "aten::_foreach_addcdiv_.ScalarList" in names  # the script's AdamW chose foreach, as on a GPU
    assert (t.alloc_kind == KIND["param"]).sum() > 0 and (t.alloc_kind == KIND["optimizer"]).sum() > 0
    assert (t.alloc_kind == KIND["input"]).sum() > 0  # batches copied to the device


def test_script_failure_and_no_step_are_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.ones(3, device='cuda')\nraise ValueError('no data directory')\n")
    r = _cli("record", "--script", str(bad), "-o", str(tmp_path / "b.uvmt"))
    assert r.returncode == 4 and "ValueError: no data directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    idle = tmp_path / "idle.py"
    idle.write_text("import torch\nassert torch.cuda.is_available()\nx = torch.ones(3).cuda() * 2\n"
                    "print(float(x.sum()))\n")
    r = _cli("record", "--script", str(idle), "-o", str(tmp_path / "i.uvmt"))
    assert r.returncode == 4 and "no optimizer step" in r.stderr and "1.0" in r.stdout
