"""``uvmprefetch shim-path``: print the LD_PRELOAD shim's path, building it on first use."""

from __future__ import annotations

NAME = "shim-path"
HELP = "print the path of the LD_PRELOAD shim (built on first use)"
DESCRIPTION = ("Print the path of libuvmshim.so, the LD_PRELOAD shim that puts a CUDA program's cudaMalloc "
               "allocations in managed memory and records its kernel launches. Built from kernels/uvmshim.c "
               "with the system C compiler on first use (no CUDA headers needed) into a cache folder "
               "($UVMPREFETCH_SHIM_DIR, else ~/.cache/uvmprefetch).")
EPILOG = """\
examples:
  LD_PRELOAD=$(uvmprefetch shim-path) ./any_cuda_program
  uvmprefetch shim-path --no-build     # fail instead of building
  uvmprefetch shim-path --json
"""


def add_arguments(p) -> None:
    p.add_argument("--no-build", action="store_true", help="do not build; fail if not built yet")
    p.add_argument("--json", action="store_true", help="print {path, built} as one JSON object")


def run(args) -> int:
    from ..runtime.shim import built_path, shim_path
    existed = built_path().is_file()
    path = shim_path(build=not args.no_build)
    if args.json:
        from . import emit_json
        emit_json({"path": str(path), "built_now": not existed})
    else:
        print(path)
    return 0
