"""``uvmprefetch.enabled(...)``: GIVEN a real transformers GPT-2 (random weights) trained on the CPU WHEN its steps run
inside ``with uvmprefetch.enabled(backend="dryrun", budget=...)`` THEN the runtime observes them under the budget,
the losses equal a plain run's bit for bit, ``run.report`` is the report the runtime wrote, and the runtime is off
after the block, also when the block raises. A block inside a running runtime, or a bad setting, is a ConfigError.

Each case runs in a child process: the runtime is process-wide (a dispatcher mode, optimizer hooks, an exit hook)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

BUDGET = 24 << 20  # the model's working set is ~36 MiB of live tensors

PRELUDE = textwrap.dedent("""
    import json, os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    import uvmprefetch
    from uvmprefetch.runtime import current

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=4096, n_positions=64,
                                       attn_implementation="eager"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)

    def train(iters):
        out = []
        for _ in range(iters):
            ids = torch.randint(0, 4096, (4, 64), generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(float(loss.detach()).hex())
        return out
""")


def child(tmp_path, body: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env["OMP_NUM_THREADS"] = "1"
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    # (a generous limit: a few CPU-seconds of training, but the shared 2-core machine can be loaded tenfold)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1200,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def block_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("enabled")
    return child(tmp, f"""
        with uvmprefetch.enabled(backend="dryrun", budget="{BUDGET}", log="quiet",
                                 report="{tmp / 'report.json'}") as run:
            inside = current() is run.session and run.session.active and run.report is None
            losses = train(2)
        print(json.dumps({{"losses": losses, "inside": inside, "after": current() is None,
                          "report": run.report, "file": json.load(open("{tmp / 'report.json'}"))}}))
    """), tmp


def test_block_runs_the_runtime_and_returns_its_report(block_run):
    got, _ = block_run
    assert got["inside"] and got["after"]
    rep = got["report"]
    assert rep == got["file"]  # run.report is the report the runtime wrote at the block's end
    assert rep["backend"] == "dryrun" and rep["budget_bytes"] == BUDGET and not rep["degraded"]
    assert rep["iterations"] == 2 and rep["launches"] > 0
    assert rep["working_set_bytes"] > BUDGET >= rep["peak_resident_bytes"] > 0  # oversubscribed, budget held
    assert rep["bytes_dtoh"] > 0  # blocks left the simulated GPU and came back


def test_losses_equal_a_plain_run(block_run, tmp_path):
    got, _ = block_run
    plain = child(tmp_path, """
        print(json.dumps({"losses": train(2)}))
    """)
    assert got["losses"] == plain["losses"]


def test_an_exception_in_the_block_still_stops_the_runtime(tmp_path):
    got = child(tmp_path, f"""
        run = None
        try:
            with uvmprefetch.enabled(backend="dryrun", budget="{BUDGET}", log="quiet") as run:
                train(1)
                raise KeyError("from the training loop")
        except KeyError as e:
            print(json.dumps({{"raised": str(e), "after": current() is None,
                              "launches": run.report["launches"]}}))
    """)
    assert got["raised"] == "'from the training loop'" and got["after"] and got["launches"] > 0


def test_a_block_inside_a_running_runtime_or_a_bad_budget_is_a_config_error(tmp_path):
    got = child(tmp_path, f"""
        from uvmprefetch.errors import ConfigError
        errors = []
        s = uvmprefetch.enable(backend="dryrun", budget="{BUDGET}", log="quiet")
        try:
            with uvmprefetch.enabled(backend="dryrun", budget="1GiB"):
                pass
        except ConfigError as e:
            errors.append(str(e))
        still = current() is s and s.active  # the outer runtime is left as it was
        uvmprefetch.disable()
        try:
            with uvmprefetch.enabled(backend="dryrun", budget="lots"):
                pass
        except ConfigError as e:
            errors.append(str(e))
        print(json.dumps({{"errors": errors, "still": still, "after": current() is None}}))
    """)
    assert got["still"] and got["after"] and len(got["errors"]) == 2
    assert "already on" in got["errors"][0]
    assert "lots" in got["errors"][1]
