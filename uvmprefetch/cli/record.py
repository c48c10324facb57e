"""``uvmprefetch record``: record training iterations of a zoo model or of a user's script into a trace."""

from __future__ import annotations

NAME = "record"
HELP = "record training iterations (zoo model or your script) into a trace, no GPU needed"
DESCRIPTION = ("Record forward, backward and optimizer step of a training loop into a trace file, on this machine "
               "and without a GPU: tensors live on PyTorch's meta device (shapes, no memory, no arithmetic) and "
               "every kernel launch, allocation and free is captured with the byte ranges it touches. Durations "
               "are estimated for --gpu with a roofline model (docs/recording.md). Either a model from the zoo "
               "(--model/--config) or an unmodified training script (--script) that uses cuda.")
EPILOG = """\
examples:
  uvmprefetch record --model gpt2 --config large --batch 8 --seq 1024 --iters 2 -o gpt2l.uvmt
  uvmprefetch record --model bert --config large --batch 16 --seq 512 --dtype bf16 -o bertl.uvmt
  uvmprefetch record --model resnet --config 152 --batch 64 --image-size 224 -o r152.uvmt
  uvmprefetch record --model t5 --config base --batch 32 --seq 512 --target-seq 128 -o t5b.uvmt
  uvmprefetch record --script train.py --iters 3 -o mine.uvmt -- --lr 3e-4 --data ./data

models: gpt2 (tiny small medium large xl), bert (tiny base large), resnet (tiny 50 101 152), vit (tiny base large),
        t5 (tiny small base large)
"""


def add_arguments(p) -> None:
    from ..gpus import DEFAULT_GPU, PROFILES
    from ..trace.models import CONFIGS, DTYPES
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=list(CONFIGS), help="zoo model family")
    src.add_argument("--script", metavar="TRAIN.py", help="an unmodified training script to run and record")
    p.add_argument("--config", metavar="NAME", help="model size (see below); default: the family's smallest "
                                                    "published size")
    p.add_argument("--batch", type=int, default=None, metavar="N", help="batch size (default 8)")
    p.add_argument("--seq", type=int, metavar="N",
                   help="sequence length (text models; gpt2 1024, bert 512; t5: the source, 512)")
    p.add_argument("--target-seq", type=int, metavar="N",
                   help="target length of an encoder-decoder (t5; default a quarter of --seq)")
    p.add_argument("--image-size", type=int, metavar="N", help="image side (image models; default 224)")
    p.add_argument("--iters", type=int, default=2, metavar="N",
                   help="optimizer steps to record (default 2; the first is not steady state)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="fp32, or bf16/fp16 mixed precision with fp32 master weights (zoo models)")
    p.add_argument("--gpu", default=DEFAULT_GPU, metavar="NAME",
                   help=f"GPU profile for the estimated durations ({', '.join(PROFILES)}; default {DEFAULT_GPU})")
    p.add_argument("-o", "--output", metavar="FILE", help="trace file to write (default: <name>.uvmt)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", action="store_true", help="print the trace's summary (as `info --json`) when done")
    p.add_argument("script_args", nargs="*", metavar="-- ARGS", help="arguments for --script, after --")


_FIRST = {"gpt2": "small", "bert": "base", "resnet": "50", "vit": "base", "t5": "small"}


def run(args) -> int:
    import sys
    import time

    from ..errors import ConfigError
    from ..gpus import get_profile
    from ..units import format_size
    from ..trace.format import save
    from ..trace.stats import summarize

    get_profile(args.gpu)
    progress = not args.no_progress and sys.stderr.isatty()
    t0 = time.perf_counter()
    if args.script:
        for flag in ("config", "batch", "seq", "target_seq", "image_size"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} applies to --model, not --script "
                                  "(pass the script's own options after --)")
        if args.dtype != "fp32":
            raise ConfigError("--dtype applies to --model; a script chooses its own precision")
        from ..trace.script import record_script
        trace = record_script(args.script, args.script_args, iters=args.iters, gpu=args.gpu, progress=progress)
    else:
        if args.script_args:
            raise ConfigError(f"unexpected arguments {' '.join(args.script_args)} (only --script takes "
                              "arguments after --)")
        from ..trace.models import record_model
        trace = record_model(args.model, args.config or _FIRST[args.model], batch=8 if args.batch is None
                             else args.batch, seq=args.seq, image_size=args.image_size, iters=args.iters,
                             dtype=args.dtype, gpu=args.gpu, progress=progress, target_seq=args.target_seq)
    elapsed = time.perf_counter() - t0
    trace.meta["record_s"] = round(elapsed, 3)
    out = args.output or f"{trace.meta.get('name', 'trace')}.uvmt"
    try:
        save(trace, out)
    except OSError as e:
        raise ConfigError(f"-o {out}: cannot write ({e.strerror})") from None
    s = summarize(trace)
    if args.json:
        from . import emit_json
        emit_json({"output": out, "record_s": elapsed, **s})
    else:
        print(f"{out}: {s['launches']} launches, {s['allocations']} allocations, {s['iterations']} iterations, "
              f"peak live {format_size(s['peak_live_bytes'])}, recorded in {elapsed:.1f} s")
    return 0
