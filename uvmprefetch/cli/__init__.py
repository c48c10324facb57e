"""The ``uvmprefetch`` command. Each subcommand is a module here with ``NAME``, ``HELP``, ``add_arguments(p)``
and ``run(args) -> int``; errors of ``UvmPrefetchError`` become one line on stderr and their exit code."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from ..errors import UvmPrefetchError
from ..jsonutil import json_default

# Order is the order shown in --help.
_COMMANDS = ["record", "info", "replay", "bench", "run", "shim_path", "doctor"]

_EPILOG = """\
examples:
  uvmprefetch record --model gpt2 --config large --batch 8 --seq 1024 --iters 2 -o gpt2l.uvmt
  uvmprefetch info gpt2l.uvmt
  uvmprefetch replay gpt2l.uvmt --gpu h100-pcie --oversub 2 --policy uvmprefetch
  uvmprefetch bench                      # every standard trace x policy x oversubscription
  uvmprefetch run --budget 20GiB -- python train.py
  UVMPREFETCH=1 python train.py          # the same, switched on by the environment

Every subcommand has --help. Set UVMPREFETCH_LOG=debug to see tracebacks of internal errors.
"""


def _load_commands():
    mods = []
    for name in _COMMANDS:
        try:
            mods.append(importlib.import_module(f"{__name__}.{name}"))
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="uvmprefetch",
        description="Transparent GPU memory oversubscription: CUDA managed memory + a learned prefetcher. "
                    "Record training traces, replay them against a simulated GPU, or run a program live.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from .. import __version__
    p.add_argument("--version", action="version", version=f"uvmprefetch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _load_commands():
        sp = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                            formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog=getattr(mod, "EPILOG", None))
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def emit_json(obj) -> None:
    """Print one JSON object on stdout (the ``--json`` contract)."""
    sys.stdout.write(json.dumps(obj, indent=None, separators=(",", ":"), default=json_default) + "\n")
    sys.stdout.flush()



def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except UvmPrefetchError as e:
        print(f"uvmprefetch {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"uvmprefetch {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - the CLI contract: one line, never a traceback
        if os.environ.get("UVMPREFETCH_LOG", "").lower() == "debug":
            raise
        print(f"uvmprefetch {args.command}: internal error: {type(e).__name__}: {e} "
              f"(set UVMPREFETCH_LOG=debug for the traceback)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
