"""The figures ``docs/policies.md``'s scorecard and ``docs/reference-systems.md``'s ranking quote: GIVEN
``bench/baselines/replay.json`` WHEN its rows are summarised as the docs do THEN each summarised row stands in the
doc, so that a new baseline without a docs update fails here (as ``test_readme.py`` checks the README's table)."""

import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPLAY = json.loads((REPO / "bench" / "baselines" / "replay.json").read_text())
OVERSUB = (1.5, 2.0, 3.0)

# the scorecard's settings of replay.json, labelled with the command that writes each
SCORECARD = (
    ("h100-pcie host=live evict=auto",
     "default (H100's measured costs, runtime threads, copy path, discards): `uvmprefetch bench --policies "
     "demand,deepum,uvmprefetch,oracle --oversub 1.5,2,3`"),
    ("h100-pcie no-discard host=live",
     "the runtime's defaults (no discards, UVM's eviction): the same with `--no-discard --evict uvm`"),
    ("h100-pcie-lit host=free", "literature profile, idle host: `uvmprefetch bench --gpu h100-pcie-lit --host free`"),
)
RANKING = "h100-pcie-lit host=free"


def _geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _rows(setting):
    data = REPLAY[setting]
    return data["traces"], {(r["trace"], r["policy"], r["oversub"]): r for r in data["rows"]}


def scorecard_rows() -> list[str]:
    """Per setting and oversubscription: uvmprefetch over the oracle, steady and whole run (geomean over the traces,
    worst trace in parentheses); demand over uvmprefetch, steady (whole); on how many traces uvmprefetch beats
    deepum, steady / whole."""
    out = []
    for setting, label in SCORECARD:
        traces, rows = _rows(setting)
        n = len(traces)
        for k, ov in enumerate(OVERSUB):
            def ratio(a, b, field):
                return [rows[(t, a, ov)][field] / rows[(t, b, ov)][field] for t in traces]
            us, uw = ratio("uvmprefetch", "oracle", "steady_slowdown"), ratio("uvmprefetch", "oracle", "slowdown")
            ds, dw = ratio("demand", "uvmprefetch", "steady_slowdown"), ratio("demand", "uvmprefetch", "slowdown")
            fs = sum(rows[(t, "uvmprefetch", ov)]["steady_slowdown"] < rows[(t, "deepum", ov)]["steady_slowdown"]
                     for t in traces)
            fw = sum(rows[(t, "uvmprefetch", ov)]["slowdown"] < rows[(t, "deepum", ov)]["slowdown"] for t in traces)
            out.append(f"| {label if k == 0 else ''} | {ov:g} | {_geomean(us):.3f} ({max(us):.3f}) | "
                       f"{_geomean(uw):.3f} ({max(uw):.3f}) | {_geomean(ds):.2f}x ({_geomean(dw):.2f}x) | "
                       f"{fs}/{n} / {fw}/{n} |")
    return out


def ranking_rows() -> list[str]:
    """Every policy's geomean slowdown over the traces, steady then whole run at each level, sorted by steady at 2x."""
    from uvmprefetch.policy import policy_class
    geo = REPLAY[RANKING]["geomean"]
    pols = sorted((p for p in geo if p != "ideal"), key=lambda p: (geo[p]["steady_slowdown"]["2"], p))
    out = []
    for p in pols:
        kind = "offline" if policy_class(p).offline else "online"
        cells = [f"{geo[p][f][f'{ov:g}']:.2f}" for f in ("steady_slowdown", "slowdown") for ov in OVERSUB]
        out.append(f"| `{p}` | {kind} | " + " | ".join(cells) + " |")
    return out


def test_the_scorecard_is_the_replay_baseline():
    doc = (REPO / "docs" / "policies.md").read_text()
    missing = [r for r in scorecard_rows() if r not in doc]
    assert not missing, "docs/policies.md's scorecard differs from bench/baselines/replay.json:\n" + "\n".join(missing)


def test_the_ranking_is_the_replay_baseline():
    doc = (REPO / "docs" / "reference-systems.md").read_text()
    missing = [r for r in ranking_rows() if r not in doc]
    assert not missing, "docs/reference-systems.md's ranking differs from replay.json:\n" + "\n".join(missing)
