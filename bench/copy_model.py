#!/usr/bin/env python3
"""The simulator's copy path with the figures a GPU measured (issue 33: step 2 takes step 1's figures).

``bench/gpu/evict_microbench.py`` writes its measurements into ``bench/baselines/gpu.json`` (``microbench``,
entries ``evict/...``). This tool reads one device's entries, turns them into the fields of the simulator's copy
path (``uvmprefetch.sim.copypath.from_microbench``; the mapping is the table in ``docs/simulator.md`` "Eviction
paths"), prints them beside the profile's research figures, and prints the replay flags that use them:

    python bench/copy_model.py [--baseline bench/baselines/gpu.json] [--device NAME] [--gpu h100-pcie-cal] [--json]

Without ``--device`` it takes the one device that has ``evict/`` entries (an error names them when there are
several). Exit 2 with one line on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from uvmprefetch.errors import ConfigError  # noqa: E402
from uvmprefetch.gpus import get_profile  # noqa: E402
from uvmprefetch.sim.copypath import from_microbench  # noqa: E402
from uvmprefetch.sim.host import HOST_PRESETS  # noqa: E402


def device_entry(data: dict, device: str | None) -> tuple[str, dict]:
    """The device's ``microbench`` object: the one named, or the only one with ``evict/`` entries."""
    have = {d: e.get("microbench") or {} for d, e in data.items() if isinstance(e, dict)}
    have = {d: mb for d, mb in have.items() if any(k.startswith("evict/") for k in mb)}
    if device is not None:
        if device not in have:
            raise ConfigError(f"--device {device!r}: no evict/ microbench entries for it; devices with some: "
                              f"{', '.join(have) or 'none'}")
        return device, have[device]
    if len(have) != 1:
        raise ConfigError("no device has evict/ microbench entries (run bench/gpu/evict_microbench.py on a GPU)"
                          if not have else f"several devices have evict/ entries: {', '.join(have)}; pick one "
                          "with --device")
    return next(iter(have.items()))


def flags(gpu_name: str, fields: dict) -> str:
    """The replay/bench flags that use ``fields`` (``from_microbench``'s result)."""
    out = [f"--gpu {gpu_name}"] + [f"--gpu-set {k}={v:.6g}" for k, v in fields["gpu"].items()]
    if fields["host"]:
        kv = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else f'{v:.6g}'}"
                      for k, v in fields["host"].items())
        out.append(f"--host live-sync:{kv}")
    return " ".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", default=str(REPO / "bench" / "baselines" / "gpu.json"), metavar="PATH",
                    help="the GPU baseline file (default bench/baselines/gpu.json)")
    ap.add_argument("--device", metavar="NAME", help="the device entry to read (default: the only one with evict/)")
    ap.add_argument("--gpu", default="h100-pcie-cal", metavar="PROFILE",
                    help="the simulator profile the figures replace (default h100-pcie-cal)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        profile = get_profile(args.gpu)
        try:
            data = json.loads(Path(args.baseline).read_text())
        except OSError as e:
            raise ConfigError(f"--baseline {args.baseline}: cannot read ({e.strerror})") from None
        except ValueError as e:
            raise ConfigError(f"--baseline {args.baseline}: not JSON ({e})") from None
        device, mb = device_entry(data, args.device)
        fields = from_microbench(mb)
    except ConfigError as e:
        print(f"copy_model: {e}", file=sys.stderr)
        return 2
    cmd = flags(profile.name, fields)
    if args.json:
        print(json.dumps({"device": device, "gpu": profile.name, **fields, "flags": cmd}))
        return 0
    host = HOST_PRESETS["live-sync"]
    print(f"{device}: the copy path measured, against {profile.name}'s research figures\n")
    print("| field | profile | measured |\n|---|---:|---:|")
    for k, v in fields["gpu"].items():
        print(f"| {k} | {getattr(profile, k):.4g} | {v:.4g} |")
    for k, v in fields["host"].items():
        print(f"| host {k} | {getattr(host, k)} | {v if isinstance(v, bool) else f'{v:.4g}'} |")
    if fields["missing"]:
        print(f"\nnot measured (the profile's figure stays): {', '.join(fields['missing'])}")
    print(f"\nreplay or bench with them:\n  uvmprefetch replay TRACE --oversub 1.5 {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
