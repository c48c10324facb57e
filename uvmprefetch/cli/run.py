"""``uvmprefetch run``: run a command with the runtime switched on (the environment way, with flags)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

NAME = "run"
HELP = "run a program with uvmprefetch switched on"
DESCRIPTION = ("Run COMMAND with the live runtime on: every CUDA allocation of a Python/PyTorch program goes to "
               "managed memory and the prefetcher moves it ahead of the kernels that need it. Flags set the "
               "UVMPREFETCH_* variables (they win over the environment), which are validated before the command "
               "starts. A non-Python program gets the LD_PRELOAD shim (allocation swap and launch recording).")
EPILOG = """\
examples:
  uvmprefetch run --budget 20GiB -- python train.py
  uvmprefetch run --backend dryrun --budget 0.25 --report run.json -- python examples/train_gpt2.py
  uvmprefetch run --policy deepum --window 16 -- python train.py
  uvmprefetch run -- ./my_cuda_program      # non-Python: LD_PRELOAD shim only
  uvmprefetch run --budget 0.5 --report r.json -- torchrun --nproc_per_node=8 train.py
                                            # a runtime per rank: r.rank0.json ... r.rank7.json
"""


def add_arguments(p) -> None:
    p.add_argument("--budget", help="GPU-resident managed memory allowed: 20GiB, 512MB, or a fraction 0.5 / 50%%")
    p.add_argument("--managed-limit", help="most managed memory the program may allocate: host (default: what host "
                   "memory can back), gpu-free (the GPU's free memory - 5 %%), or bytes with a unit: 200GiB")
    p.add_argument("--policy", help="policy name with optional parameters (default: the best available)")
    p.add_argument("--backend", choices=["cuda", "dryrun"], help="cuda (default) or dryrun (CPU, simulated GPU)")
    p.add_argument("--window", help="auto or a positive integer")
    p.add_argument("--report", help="write the JSON run report here")
    p.add_argument("--trace", help="record the live run as a trace file here")
    p.add_argument("--gpu", help="dryrun: the simulated GPU profile")
    p.add_argument("--log", choices=["quiet", "warning", "info", "debug"])
    p.add_argument("--json", action="store_true",
                   help="after COMMAND exits, print {returncode, report, rank_reports} as one JSON line on stdout "
                        "(last line; rank_reports: {rank: report} of a torchrun job)")
    p.add_argument("cmd", nargs="+", metavar="COMMAND", help="the program and its arguments (after --)")


def run(args) -> int:
    from ..config import from_env
    from ..errors import ConfigError
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("no command given: uvmprefetch run [options] -- COMMAND ...")
    env = dict(os.environ)
    flags = {"UVMPREFETCH_BUDGET": args.budget, "UVMPREFETCH_POLICY": args.policy, "UVMPREFETCH_BACKEND": args.backend,
             "UVMPREFETCH_WINDOW": args.window, "UVMPREFETCH_REPORT": args.report, "UVMPREFETCH_TRACE": args.trace,
             "UVMPREFETCH_GPU": args.gpu, "UVMPREFETCH_LOG": args.log, "UVMPREFETCH_MANAGED_LIMIT": args.managed_limit}
    env.update({k: str(v) for k, v in flags.items() if v is not None})
    env["UVMPREFETCH"] = "1"
    env.pop("UVMPREFETCH_OWNER", None)
    cfg = from_env(env)  # validate here: one clear line before anything starts
    if cfg.backend == "cuda":
        from ..runtime.device import require_cuda
        require_cuda()
        if not _is_python(cmd[0]):
            from ..runtime.shim import shim_path
            env["LD_PRELOAD"] = " ".join(filter(None, [str(shim_path()), env.get("LD_PRELOAD", "")]))
    elif not _is_python(cmd[0]):
        raise ConfigError("the dryrun backend observes PyTorch programs only; COMMAND must be a Python program")
    tmp = None
    if args.json and not cfg.report:
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix="uvmprefetch-report-", suffix=".json")
        os.close(fd)
        os.unlink(tmp)
        env["UVMPREFETCH_REPORT"] = tmp
    started = time.time()
    try:
        rc = subprocess.call(cmd, env=env)
    except FileNotFoundError:
        raise ConfigError(f"command not found: {cmd[0]}") from None
    except KeyboardInterrupt:
        rc = 130
    if args.json:
        from . import emit_json
        emit_json(_collect_reports(rc, env.get("UVMPREFETCH_REPORT"), tmp, started))
    return rc


def _collect_reports(rc: int, path: str | None, tmp: str | None, started: float) -> dict:
    """``{returncode, report, rank_reports}``: the report at ``path``, and those its ranks wrote during this run
    (torchrun: ``r.rank0.json``, ...; ``{rank: report}``, empty for a single process). ``tmp`` reports are
    removed after."""
    import json
    from ..runtime.ranks import reports_of
    report, per_rank = None, {}
    if path:
        files = {r: p for r, p in reports_of(path).items() if os.path.getmtime(p) >= started - 1}
        for rank, p in files.items():
            with open(p) as f:
                per_rank[str(rank)] = json.load(f)
        if os.path.exists(path) and "{rank}" not in path:
            with open(path) as f:
                report = json.load(f)
        for p in ([tmp, *files.values()] if tmp else []):
            if os.path.exists(p):
                os.unlink(p)
    return {"returncode": rc, "report": report, "rank_reports": per_rank}


def _is_python(prog: str) -> bool:
    base = os.path.basename(prog)
    if base.startswith("python") or os.path.realpath(prog) == os.path.realpath(sys.executable):
        return True
    try:  # a script with a python shebang
        with open(prog if os.sep in prog else (_which(prog) or prog), "rb") as f:
            first = f.readline(200)
        return first.startswith(b"#!") and b"python" in first
    except OSError:
        return False


def _which(prog: str) -> str | None:
    import shutil
    return shutil.which(prog)
