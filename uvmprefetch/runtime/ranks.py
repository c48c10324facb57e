"""Multi-process launches: which process runs the runtime, on which device, writing which files.

A launcher (``torchrun``, ``python -m torch.distributed.run`` / ``torch.distributed.launch``) starts one
worker per GPU and does no GPU work itself. Under ``UVMPREFETCH=1`` the launcher does nothing (no shim, no
runtime, no report) and leaves ``UVMPREFETCH_OWNER`` unset, so each worker is the first process of its own
tree to see ``UVMPREFETCH=1`` and owns a runtime. A worker is a *rank*: ``RANK`` or ``LOCAL_RANK``, and
``WORLD_SIZE``, are in its environment (torchrun's elastic agent sets them, with ``TORCHELASTIC_RUN_ID``,
for the workers only; other launchers follow the same convention). The owner of a tree records
its pid in ``UVMPREFETCH_OWNER`` and its rank in ``UVMPREFETCH_OWNER_RANK``; a child that inherits both with
the same rank is a DataLoader worker or another helper of that rank and stays plain, a child with another
rank is a rank of a launcher we did not recognise (the launcher then owns a runtime of its own, idle).

``torch.multiprocessing.spawn`` sets no variable in its children (checked in torch 2.13: ``start_processes``
passes the index as an argument); at start-up they cannot be told from spawn-context DataLoader workers, so
they stay plain. Calling ``uvmprefetch.enable()`` in the worker after ``init_process_group`` gives it a
runtime named after its ``torch.distributed`` rank.

Per rank: the runtime runs on ``LOCAL_RANK``'s device (the only visible one when ``CUDA_VISIBLE_DEVICES``
leaves one), a budget is per rank (a fraction is of that rank's device), and the report and trace paths get
``.rank<N>`` before their suffix unless they contain ``{rank}``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

from ..errors import DeviceError

OWNER = "UVMPREFETCH_OWNER"
OWNER_RANK = "UVMPREFETCH_OWNER_RANK"
# Launchers that start the ranks and do no GPU work themselves (their own Python process).
LAUNCHER_SCRIPTS = ("torchrun",)
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class Rank:
    """This process's place in a distributed job.

    ``source`` is ``"env"`` (a launcher's variables) or ``"torch.distributed"`` (an initialised default
    process group: ``local_rank`` unknown, the device is the one the program selected).
    """

    rank: int
    world_size: int
    local_rank: int | None = None
    source: str = "env"

    def identity(self) -> str:
        """What ``UVMPREFETCH_OWNER_RANK`` holds: equal for a rank and its children, different between ranks."""
        return f"{self.rank}/{self.world_size}/{'' if self.local_rank is None else self.local_rank}"

    def __str__(self) -> str:
        return f"rank {self.rank}"

    def as_dict(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "source": self.source}


UNKNOWN = "?"  # UVMPREFETCH_OWNER_RANK of a process whose rank variables make no rank


@dataclass(frozen=True)
class Role:
    """What the start-up hook does in this process.

    ``kind``: ``"owner"`` (run the runtime; ``rank`` None for a single-process run), ``"launcher"`` (do
    nothing, leave the environment as it is), ``"child"`` (a child of an owner: stay plain), ``"plain"`` (a
    rank that cannot run the runtime: say ``note`` once, stay plain, keep its children plain).
    """

    kind: str
    rank: Rank | None = None
    note: str = ""
    unknown: bool = False  # the rank variables are there but make no rank

    @property
    def identity(self) -> str:
        """What ``claim`` records for this process's children."""
        return UNKNOWN if self.unknown else self.rank.identity() if self.rank is not None else ""


def _int_var(environ, name: str) -> int | None:
    text = environ.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        v = int(text.strip())
    except ValueError:
        raise DeviceError(f"{name}={text!r} is not a rank number") from None
    if v < 0:
        raise DeviceError(f"{name}={text!r} is negative")
    return v


def rank_from_env(environ=None) -> Rank | None:
    """The rank the launcher's variables give, or None when this process is not a launched rank.

    Raises
    ------
    DeviceError
        The variables are there but do not make a rank (not numbers, ``RANK`` not below ``WORLD_SIZE``).
    """
    env = os.environ if environ is None else environ
    if not env.get("WORLD_SIZE", "").strip() or not (env.get("RANK", "").strip() or env.get("LOCAL_RANK", "").strip()):
        return None
    world = _int_var(env, "WORLD_SIZE")
    rank, local = _int_var(env, "RANK"), _int_var(env, "LOCAL_RANK")
    if rank is None:  # LOCAL_RANK alone: one node
        rank = local
    if not world or rank >= world:
        raise DeviceError(f"RANK={rank} with WORLD_SIZE={env.get('WORLD_SIZE')!r} is not a rank of the job")
    return Rank(rank=rank, world_size=world, local_rank=local)


def this_rank(environ=None) -> Rank | None:
    """This process's rank: the launcher's variables, else an initialised ``torch.distributed`` group, else
    None. Never imports torch.

    Raises
    ------
    DeviceError
        As ``rank_from_env``.
    """
    r = rank_from_env(environ)
    if r is not None:
        return r
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return Rank(rank=dist.get_rank(), world_size=dist.get_world_size(), source="torch.distributed")
    except Exception:  # noqa: BLE001 - a half-torn-down group is no rank
        return None
    return None


def program_of(argv: list[str]) -> tuple[str, str]:
    """``("-m", module)``, ``("script", basename)``, ``("-c", "")`` or ``("", "")`` (the REPL) for an interpreter
    command line ``[python, options..., script | -m module | -c code, args...]`` (``sys.orig_argv``)."""
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-"):
        i += 2 if argv[i] in ("-W", "-X", "-Q") else 1
    if i >= len(argv):
        return "", ""
    if argv[i] == "-m":
        return ("-m", argv[i + 1]) if i + 1 < len(argv) else ("", "")
    if argv[i] in ("-c", "-"):
        return argv[i], ""
    return "script", os.path.basename(argv[i])


def is_launcher(argv: list[str]) -> bool:
    """Is this interpreter a launcher that only starts ranks (torchrun and its module forms)?"""
    kind, name = program_of(argv)
    return (kind == "script" and name in LAUNCHER_SCRIPTS) or (kind == "-m" and name in LAUNCHER_MODULES)


def role_of(environ, pid: int, argv: list[str]) -> Role:
    """Decide what the start-up hook does in process ``pid`` with ``environ`` and command line ``argv``."""
    owner = environ.get(OWNER, "")
    if owner == str(pid):  # re-executed with the shim: it already chose to own
        try:
            return Role("owner", rank_from_env(environ))
        except DeviceError:
            return Role("owner", unknown=True)
    if is_launcher(argv):
        return Role("launcher")
    try:
        rank = rank_from_env(environ)
    except DeviceError as e:
        if owner and environ.get(OWNER_RANK) == UNKNOWN:  # a child of a rank that already said so
            return Role("child")
        return Role("plain", note=f"{e}; this process runs without uvmprefetch", unknown=True)
    if owner and (rank is None or environ.get(OWNER_RANK, "") == rank.identity()):
        return Role("child")
    return Role("owner", rank)


def claim(environ, pid: int, role: Role) -> None:
    """Record in ``environ`` that ``pid`` owns this process tree: its children inherit it and stay plain."""
    environ[OWNER] = str(pid)
    environ[OWNER_RANK] = role.identity


def device_index(rank: Rank, visible: int) -> int:
    """The CUDA device (index among the ``visible`` ones) that ``rank`` runs on.

    ``LOCAL_RANK`` when given; with one visible device (``CUDA_VISIBLE_DEVICES`` set per rank) that one; without
    ``LOCAL_RANK``, ``RANK`` when the whole job fits the visible devices (one node).

    Raises
    ------
    DeviceError
        No device can be named (the message names the rank and the variables).
    """
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"this process sees {visible} GPU(s)" + (f" (CUDA_VISIBLE_DEVICES={vis})" if vis is not None else "")
    if visible <= 0:
        raise DeviceError(f"{rank}: {seen}")
    if visible == 1:
        return 0
    if rank.local_rank is not None:
        if rank.local_rank < visible:
            return rank.local_rank
        raise DeviceError(f"{rank}: LOCAL_RANK={rank.local_rank} names no GPU: {seen}")
    if rank.world_size <= visible:
        return rank.rank
    raise DeviceError(f"{rank}: no LOCAL_RANK, and RANK {rank.rank} of {rank.world_size} names none of the "
                      f"GPUs: {seen}")


def rank_path(path: str | None, rank: Rank | None) -> str | None:
    """``r.json`` -> ``r.rank1.json`` for rank 1; ``{rank}`` in the path is replaced instead (by 0 outside a
    distributed job); None and paths of a process that is no rank stay as they are."""
    if path is None:
        return None
    if "{rank}" in path:
        return path.replace("{rank}", str(rank.rank if rank is not None else 0))
    if rank is None:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank.rank}{suffix}"


def for_rank(cfg, rank: Rank | None):
    """``cfg`` with its report and trace paths named for ``rank`` (the budget is per rank as it stands)."""
    return dataclasses.replace(cfg, report=rank_path(cfg.report, rank), trace=rank_path(cfg.trace, rank))


def select_device(rank: Rank) -> int:
    """Make the rank's device current (before the cuda backend reads ``torch.cuda.current_device()``) and
    return it; a rank found through ``torch.distributed`` keeps the device the program selected.

    Raises
    ------
    DeviceError
        As ``device_index``.
    """
    import torch
    if rank.source != "env":
        return torch.cuda.current_device()
    dev = device_index(rank, torch.cuda.device_count())
    torch.cuda.set_device(dev)
    return dev


def reports_of(path: str) -> dict[int, str]:
    """The per-rank files a run with report (or trace) path ``path`` wrote: ``{rank: path}``, by rank."""
    import glob
    import re
    if "{rank}" in path:
        parts = path.split("{rank}")
        pattern = "*".join(glob.escape(p) for p in parts)
        regex = r"(\d+)".join(re.escape(p) for p in parts)
    else:
        stem, suffix = os.path.splitext(path)
        pattern = f"{glob.escape(stem)}.rank*{glob.escape(suffix)}"
        regex = re.escape(stem) + r"\.rank(\d+)" + re.escape(suffix)
    out = {}
    for p in glob.glob(pattern):
        m = re.fullmatch(regex, p)
        if m:
            out[int(m.group(1))] = p
    return dict(sorted(out.items()))
