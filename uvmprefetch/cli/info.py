"""``uvmprefetch info``: what a trace holds: events, footprint by kind, working set, ideal iteration time."""

from __future__ import annotations

NAME = "info"
HELP = "summarise a trace: footprint breakdown, working set, ideal iteration time per GPU"
DESCRIPTION = ("Load and validate a trace, then print its size (launches, allocations, iterations), the peak live "
               "footprint and its breakdown (parameters, AdamW state, gradients, activations), the distinct bytes "
               "touched in one steady-state iteration, and the estimated iteration time on each GPU profile with "
               "all data resident (the 'ideal' that replay slowdowns are relative to).")
EPILOG = """\
examples:
  uvmprefetch info gpt2l.uvmt
  uvmprefetch info gpt2l.uvmt --json | python -m json.tool
"""


def add_arguments(p) -> None:
    p.add_argument("trace", metavar="TRACE", help="trace file (.uvmt)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from ..trace.format import load
    from ..trace.stats import summarize
    from ..units import format_size

    t = load(args.trace)
    s = summarize(t)
    if args.json:
        from . import emit_json
        emit_json(s)
        return 0
    m = s["meta"]
    what = m.get("name") or m.get("script") or "trace"
    shape = ", ".join(f"{k} {m[k]}" for k in ("batch", "seq", "target_seq", "image_size", "dtype")
                      if m.get(k) is not None)
    print(f"{args.trace}: {what}" + (f" ({shape})" if shape else "") +
          (f", {m['params'] / 1e6:.1f}M parameters" if m.get("params") else ""))
    print(f"  events       {s['launches']} launches ({s['launches_per_iteration']} in steady iteration "
          f"{s['steady_iteration']}), {s['allocations']} allocations, {s['accesses']} accesses, "
          f"{s['iterations']} iterations")
    print("  phases       " + ", ".join(f"{k} {v}" for k, v in s["phases"].items() if v))
    rows = [("peak live", s["peak_live_bytes"]), ("  parameters", s["param_bytes"]),
            ("  optimizer state", s["optimizer_bytes"]), ("  gradients (peak)", s["gradient_bytes"]),
            ("  activations (peak)", s["activation_peak_bytes"]), ("  inputs (peak)", s["input_bytes"]),
            ("  other (peak)", s["other_peak_bytes"]),
            ("working set / iteration", s["working_set_bytes"]), ("allocated in total", s["bytes_allocated"])]
    print("  memory")
    for label, v in rows:
        print(f"    {label:<26}{format_size(v):>12}")
    print("    (the per-kind peaks occur at different times; their sum bounds the peak live footprint)")
    print(f"  compute      {s['flops_per_iteration'] / 1e12:.2f} TFLOP per iteration")
    print("  ideal iteration time (all data resident, roofline estimate)")
    for g, v in s["ideal_s"].items():
        mark = "  <- recorded for" if g == m.get("gpu") else ""
        print(f"    {g:<26}{v * 1e3:>10.1f} ms{mark}")
    return 0
