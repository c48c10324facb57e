"""bench/allocmap_bound.py: the bound on what exact allocation-time moves could give ``uvmprefetch`` (every
iteration's tensors placed where the last iteration's are), on the shipped trace."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace.format import load

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "traces" / "gpt2-small-b2s128.uvmt"
BS = 2 << 20


@pytest.fixture(scope="module")
def small():
    t = load(SMALL)
    return t, build_layout(t, BS)


def _bound():
    spec = importlib.util.spec_from_file_location("allocmap_bound", ROOT / "bench" / "allocmap_bound.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_bound_places_every_iteration_where_the_last_one_is(small):
    t, _ = small
    mod = _bound()
    # WHEN the pinned layout is built
    real, pin, info = mod.pinned_layout(t, BS)
    partner, _ = mod.pair_with_last(t)
    # THEN no two live allocations overlap, every paired allocation sits at its partner's address, the others stay
    base, rsize, _, _ = mod._layout._allocate_addresses(t, "caching")
    pinned_base = pin.base
    assert mod.overlaps(t, pinned_base, rsize) == [] and info["conflicts"] == 0
    ok = partner >= 0
    assert np.array_equal(pinned_base[ok], base[partner[ok]]) and np.array_equal(pinned_base[~ok], base[~ok])
    assert info["iterations"][1]["same_sequence"] and info["repinned"] > 0
    # ... and the policy replayed there learns fewer moves than on the real layout
    moved = [replay(t, "uvmprefetch", "h100-pcie", oversub=1.5, layout=lay)["policy_report"]["moved_blocks"]
             for lay in (real, pin)]
    assert moved[1] < moved[0]


def test_the_bound_prints_its_table_or_one_line(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "bench/allocmap_bound.py", *args], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)

    # WHEN it runs on the shipped trace THEN the table comes last, one row per oversubscription
    r = run(str(SMALL), "--oversub", "1.5")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.strip().splitlines()
    assert rows[-2].split()[:2] == ["trace", "x"] and rows[-1].split()[:2] == ["gpt2-small-b2s128", "1.5"]
    # ... and bad input gets one line and exit 2
    for args in ((str(tmp_path / "none.uvmt"),), (str(SMALL), "--oversub", "1.5,x")):
        r = run(*args)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 1 and err[0].startswith("error:"), r.stderr
