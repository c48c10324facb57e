"""Replay ``uvmprefetch`` on the four standard traces at 1.5 / 2 / 3x (h100-pcie) from the package in PKG and write
each replay's whole-run slowdown, steady slowdown, accuracy, coverage, one-kernel steps and launches to OUT.json.

    python quality.py PKG OUT.json

With ``plan_every.patch`` applied to PKG, ``UVMP_PLAN_EVERY=k`` makes the policy plan only on every k-th launch
(README.md, "Batched decisions"). The standard traces must be recorded (``uvmprefetch bench`` does it once).
"""
import glob
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402
from uvmprefetch.trace.format import load  # noqa: E402

out = {}
for path in sorted(glob.glob(os.path.expanduser("~/.cache/uvmprefetch/traces/*/*.uvmt"))):
    tr = load(path)
    nm = os.path.basename(path)[:-5]
    for ov in (1.5, 2.0, 3.0):
        r = replay(tr, make_policy("uvmprefetch"), "h100-pcie", oversub=ov)
        out[f"{nm}@{ov}"] = (r["slowdown"], r["steady_slowdown"], r["accuracy"], r["coverage"],
                             r["policy_report"].get("one_kernel_steps"), r["policy_report"].get("launches"))
        print(nm, ov, "%.4f %.4f acc %.3f cov %.3f" % out[f"{nm}@{ov}"][:4], flush=True)
json.dump(out, open(sys.argv[2], "w"), indent=1)
