"""The table of README.md "Batched decisions": uvmprefetch / oracle, geomean over the four standard traces, whole
run (steady state in brackets), for each k; the oracle's times from ../replay-20261123f. Run:

    python bench/results/policy-cost-20261124g/plan_every_table.py
"""
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def key(x):
    return x["trace"], round(float(x.get("oversub_target") or x["oversub"]), 2)


def geomean(a):
    return math.exp(sum(map(math.log, a)) / len(a))


r = json.load(open(os.path.join(HERE, "..", "replay-20261123f", "results.json")))["results"]
orc = {key(x): (x["slowdown"], x["steady_slowdown"]) for x in r if x["policy"] == "oracle"}
ups = {key(x): (x["slowdown"], x["steady_slowdown"]) for x in r if x["policy"] == "uvmprefetch"}
q = {k: json.load(open(os.path.join(HERE, f"plan-every-{k}.json"))) for k in (1, 2, 4, 8)}
names = sorted({k.split("@")[0] for k in q[1]})
same = all(abs(q[1][f"{t}@{ov}"][0] - ups[(t, ov)][0]) < 1e-9 for t in names for ov in (1.5, 2.0, 3.0))
print("k=1 is the scorecard's uvmprefetch:", same)
print("| oversub | plan every launch (k=1) | k=2 | k=4 | k=8 |")
print("| --- | --- | --- | --- | --- |")
for ov in (1.5, 2.0, 3.0):
    cells = []
    for k in (1, 2, 4, 8):
        ws = [q[k][f"{t}@{ov}"][0] / orc[(t, ov)][0] for t in names]
        ss = [q[k][f"{t}@{ov}"][1] / orc[(t, ov)][1] for t in names]
        cells.append("%.3f (%.3f)" % (geomean(ws), geomean(ss)))
    print(f"| {ov:g} | " + " | ".join(cells) + " |")
for k in (1, 2, 4, 8):
    acc = [v[2] for v in q[k].values()]
    cov = [v[3] for v in q[k].values()]
    print(f"k={k}: accuracy {min(acc):.2f}-{max(acc):.2f}, coverage {min(cov):.2f}-{max(cov):.2f}")
