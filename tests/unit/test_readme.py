"""The README: GIVEN its first code block WHEN read THEN it is exactly the two set-up commands, the first installing
and running the main job and the second installing and running the tests, which `.ci/run` runs as written; and
the figures its "When to use it" section quotes are those of the baseline files, so that a new baseline without
a README update fails here."""

import json
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PROSE = " ".join(README.split())  # line breaks of wrapped text as single spaces
BASE = REPO / "bench" / "baselines"

# the settings of bench/baselines/replay.json the README's simulator table quotes, with their labels
SIM_SETTINGS = (("h100-pcie host=live evict=auto", "default: H100's costs, runtime threads, copy path, discards"),
                ("h100-pcie no-discard host=live", "the runtime's defaults: UVM's eviction, no discards"),
                ("h100-pcie-lit host=free", "literature profile (`h100-pcie-lit`), free host"))
SIM_POLICIES = ("demand", "deepum", "uvmprefetch", "oracle")
SIM_OVERSUB = ("1.5", "2", "3")


def commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    return [ln.split("#")[0].strip() for ln in block.strip().splitlines()]


def test_the_first_block_is_the_two_commands_and_ci_runs_the_second():
    first, second = commands()
    assert first.startswith("python3 -m pip install torch==2.13.0 -e . && ") and "uvmprefetch bench" in first
    assert second.startswith("python3 -m pip install torch==2.13.0 -e \".[test]\" && ") and "pytest" in second
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))]
    assert ci == [second]


def sim_rows() -> list[str]:
    """The simulator table's rows as the README writes them, from replay.json's geomeans."""
    data = json.loads((BASE / "replay.json").read_text())
    rows = []
    for key, label in SIM_SETTINGS:
        geo = data[key]["geomean"]
        for ov in SIM_OVERSUB:
            cells = []
            for pol in SIM_POLICIES:
                whole, steady = geo[pol]["slowdown"].get(ov), geo[pol]["steady_slowdown"].get(ov)
                cells.append("—" if whole is None else f"{whole:.2f} ({steady:.2f})")
            rows.append(f"| {label} | {ov}x | " + " | ".join(cells) + " |")
    return rows


def test_the_simulator_table_is_the_replay_baseline():
    missing = [r for r in sim_rows() if r not in README]
    assert not missing, "README's simulator table differs from bench/baselines/replay.json:\n" + "\n".join(missing)


def test_the_gpu_figures_are_the_gpu_baseline():
    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import baseline
    gpu = baseline.load(BASE / "gpu.json")
    h100 = {c["name"]: c for c in gpu["NVIDIA H100 80GB HBM3"]["cases"]}
    h200 = {c["name"]: c for c in gpu["NVIDIA H200"]["cases"]}

    def s(c) -> str:
        return f"{c['s_per_iter_median']:.2f}"
    ovs = {r: (h100[f"oversub/gpt2-large/managed/{r}"], h100[f"oversub/gpt2-large/uvmprefetch/{r}"]) for r in ("1.5", "2")}
    for r, label in (("1.5", "budget 1.5x below the working set"), ("2", "budget 2x below")):
        m, u = ovs[r]
        assert f"| H100, {label} (`oversub.py`) | {m['plain_s_per_iter']:.2f} | {s(m)} | {s(u)} |" in README
    for dev, cases, r in (("H100", h100, "1.5"), ("H100", h100, "2"), ("H200", h200, "1.5")):
        m = cases[f"diagnose/gpt2-large/demand/{r}/4-iterations"]
        u = cases[f"diagnose/gpt2-large/uvmprefetch/{r}/4-iterations"]
        assert f"| {dev}, {r}x (`diagnose.py`) | — | {s(m)} | {s(u)} |" in README
    fit = h100["overhead/gpt2-medium/fits"]
    ratio = fit["s_per_iter_median"] / fit["plain_s_per_iter"]
    assert f"{ratio:.1f}x slower on an H100 ({fit['s_per_iter_median']:.2f} against {fit['plain_s_per_iter']:.2f} s" in PROSE
    assert all(c["losses_bit_equal_plain"] for n, c in h100.items() if n.startswith("correctness/"))
    m, u = ovs["1.5"]
    assert f"({m['s_per_iter_median'] / u['s_per_iter_median']:.2f}x, at 1.5x on the" in PROSE
    slow = [c["s_per_iter_median"] / c["plain_s_per_iter"] for pair in ovs.values() for c in pair]
    assert f"{math.floor(min(slow)):d}-{math.floor(max(slow)):d}x slower" in PROSE
