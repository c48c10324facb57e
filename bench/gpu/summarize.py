"""Turn the GPU validation results (a run folder's ``*.json``) into one Markdown summary.

Reads whichever of calibrate.json, correctness.json, overhead.json, oversub.json, fidelity.json,
distributed.json, alternatives.json and replay_gpu.json exist in ``--results`` and writes ``gpu-summary.md``
beside them (or to ``--md``): one line per script with its device, date, verdict and headline figure, then each
script's own table and checks. Needs no GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import _common as C

SCRIPTS = ["calibrate", "correctness", "overhead", "oversub", "fidelity", "distributed", "alternatives", "replay_gpu"]


def _pct(x) -> str:
    return f"{x:+.1%}" if isinstance(x, (int, float)) and x == x else "-"


def headline(name: str, r: dict) -> str:
    """The one figure each script exists for."""
    try:
        if name == "calibrate":
            f = r["fit"]
            return (f"H2D {f['link_htod_bw'] / 1e9:.1f} GB/s, D2H {f['link_dtoh_bw'] / 1e9:.1f} GB/s (managed "
                    f"prefetch); fault {f['fault_full_s_per_block'] * 1e6:.0f} us per 2 MB block; batch latency "
                    f"{f['fault_batch_latency_s'] * 1e6:.1f} us")
        if name == "correctness":
            bad = [c["name"] for c in r["checks"] if c["ok"] is False]
            kind = "bitwise" if r.get("deterministic_kernels") else "by tolerance (kernels not deterministic)"
            return f"losses compared {kind}; " + (f"mismatch: {', '.join(bad)}" if bad else "all equal")
        if name == "overhead":
            return f"overhead {_pct(r['overhead'])} (target <= {r['target']:.0%}; noise {_pct(r.get('noise'))})"
        if name == "oversub":
            h = r.get("headline_speedup")
            d = r.get("speedup_vs_deepum") or []
            return (f"uvmprefetch over managed {h:.2f}x geomean at ratios {r['ratios']}"
                    + (f"; over deepum {C.geomean(d):.2f}x" if d else "")) if h == h else "no speed-up measured"
        if name == "fidelity":
            m = r.get("max_abs_error")
            return (f"max |error| {m:.1%} over {len(r['cases'])} cases (target +-{r['target']:.0%}); profile "
                    f"{r['profile']}") if m is not None else "no case replayed"
        if name == "distributed":
            bad = [c["name"] for c in r["checks"] if c["ok"] is False]
            return (f"{r['nproc']} rank(s), {r['wrap']}, budget {r['budget_bytes']} B: "
                    + (f"failed: {', '.join(bad)}" if bad else "losses bit-equal, a report per rank"))
        if name == "alternatives":
            return "; ".join(f"@{o}x: " + ", ".join(f"{m} {t:.3g} s" for t, m in sorted(v))
                             for o, v in _trained(r).items()) + f" (plain, no cap: {r['plain_s']:.3g} s/iter)"
        if name == "replay_gpu":
            m = r.get("median_abs_error")
            return (f"{len(r['cases'])} trace replays, median |error| of the simulator's prediction {m:.1%} "
                    f"(target +-20%); profile {r['profile']}") if m is not None else "no case replayed"
    except (KeyError, TypeError, ZeroDivisionError) as e:
        return f"(result incomplete: {type(e).__name__}: {e})"
    return ""


def _trained(r: dict) -> dict:
    """alternatives.json: {oversub: [(s/iter, method)]} of the methods that trained under a budget."""
    out: dict = {}
    for row in r["rows"]:
        t = (row.get("verdict") or {}).get("s_per_iter")
        if row["oversub"] != "fits" and t:
            out.setdefault(row["oversub"], []).append((t, row["method"]))
    return out


def summarize(results: Path) -> tuple[str, int]:
    """(Markdown, number of results found)."""
    found = {n: json.loads((results / f"{n}.json").read_text()) for n in SCRIPTS if (results / f"{n}.json").exists()}
    lines = ["# GPU validation summary", "",
             f"From `{results}` by `bench/gpu/summarize.py`. Each script's JSON holds the raw numbers.", ""]
    rows = []
    for n, r in found.items():
        env = r.get("env", {})
        rows.append([n, env.get("device", "?"), env.get("driver", "?"), env.get("torch", "?"),
                     env.get("date_utc", "?"), ("PASS" if r.get("passed") else "FAIL")
                     + (" (dry-run)" if env.get("dry_run") else ""), headline(n, r)])
    lines += [C.md_table(["script", "device", "driver", "torch", "date (UTC)", "verdict", "headline"], rows), ""]
    missing = [n for n in SCRIPTS if n not in found]
    if missing:
        lines += [f"Not run: {', '.join(missing)}.", ""]
    for n, r in found.items():
        t = r.get("table", {})
        lines += [f"## {n}", "", C.md_table(t.get("headers", []), t.get("rows", [])), "",
                  C.checks_table([C.Check(**c) for c in r.get("checks", [])]), ""]
    return "\n".join(lines), len(found)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu/summarize.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=None, help="folder of the result JSONs (default: the current "
                   "directory, or the dry-run folder with --dry-run)")
    p.add_argument("--dry-run", action="store_true",
                   help=f"read the dry-run results ({C.DRYRUN_DIR.relative_to(C.REPO)})")
    p.add_argument("--md", type=Path, default=None, help="output file (default: <results>/gpu-summary.md)")
    args = p.parse_args(argv)
    results = args.results or (C.DRYRUN_DIR if args.dry_run else Path.cwd())
    if not results.is_dir():
        C.fail("summarize", f"--results {results}: no such folder")
    text, n = summarize(results)
    if n == 0:
        C.fail("summarize", f"no result JSON ({', '.join(s + '.json' for s in SCRIPTS)}) in {results}", 1)
    md = args.md or results / "gpu-summary.md"
    md.write_text(text + "\n")
    print(text)
    print(f"\nwritten: {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
