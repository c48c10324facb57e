"""Build the native pieces under ``kernels/`` on first use, into a private per-user cache, and load them safely.

One builder for every library (the LD_PRELOAD shim, the C++ observer): ``make`` in ``kernels/`` (its Makefile
holds the compiler flags) with the output in a cache folder named by a key over everything that changes the
binary: the sources and headers, the Makefile, the compiler's identity and, for libraries built against torch,
torch's version and C++ ABI flag (and whether CUDA headers were found). A changed source or an upgraded torch
therefore builds a new library next to the old ones and never loads a stale one.

Safety: a library in a cache is code that will run inside the user's training process, so a cache must not be
a way to inject it. The cache root is created 0700; a folder or library whose owner is not this user, or that
group or others may write, is never loaded: it is removed and rebuilt (or, when it cannot be removed, the build
goes to a fresh private folder). Each build writes ``build.json`` with its key and the SHA-256 of the library;
a library whose recorded key or hash does not match is rebuilt too. Two processes starting at once build once
(a lock file).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from ..errors import UvmPrefetchError


class NativeBuildError(UvmPrefetchError):
    """A native library could not be built or may not be loaded; the message says why in one line."""

    exit_code = 6


@dataclasses.dataclass(frozen=True)
class Library:
    """A library under ``kernels/``: its make target, output file and what its build key covers."""

    name: str  # short name: "shim", "observer"
    target: str  # make target
    filename: str  # what make writes into O=
    inputs: tuple[str, ...]  # files of kernels/ hashed into the key
    torch: bool = False  # built against torch (key += torch version, ABI flag; make gets the torch paths)
    compiler_var: str = "CC"


SHIM = Library("shim", "", "libuvmshim.so", ("uvmshim.c", "Makefile"))
OBSERVER = Library("observer", "observer", "libuvmobserver.so",
                   ("observer.cpp", "cpu_alloc.cpp", "gate.cpp", "uvmring.h", "uvmevents.h", "uvmobs.h", "blake2b.h",
                    "Makefile"), torch=True, compiler_var="CXX")
# Sources that need CUDA headers and libc10_cuda.so join the observer library when both exist (Makefile:
# OBS_CUDA_SRCS): the caching allocator's trace tracker. Their names go here so that they are part of the key.
OBSERVER_CUDA_INPUTS: tuple[str, ...] = ("alloc_tracker.cpp",)


def source_dir() -> Path:
    """The folder holding the native sources and their Makefile (the repository's ``kernels/``, or the copy a
    wheel ships as ``uvmprefetch/_kernels/``)."""
    here = Path(__file__).resolve().parent
    for cand in (here.parents[1] / "kernels", here.parent / "_kernels"):
        if (cand / "Makefile").is_file():
            return cand
    raise NativeBuildError(f"native sources (kernels/Makefile) not found next to the package ({here.parents[1]})")


def cache_root() -> Path:
    """``$UVMPREFETCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/uvmprefetch``, else ``~/.cache/uvmprefetch``
    (``$UVMPREFETCH_SHIM_DIR`` is still honoured for the shim)."""
    d = os.environ.get("UVMPREFETCH_CACHE_DIR")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "uvmprefetch"


def _compiler_id(cmd: str) -> str:
    exe = shutil.which(cmd)
    if exe is None:
        raise NativeBuildError(f"no compiler `{cmd}` on PATH (set {'CXX' if 'c++' in cmd or '++' in cmd else 'CC'} "
                               "or install one); building needs it")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"compiler `{cmd}` does not run: {e}") from None
    return f"{os.path.realpath(exe)} {out.splitlines()[0] if out else ''}"


def torch_facts() -> dict:
    """What a library built against torch depends on: version, C++ ABI flag, include and lib folders, and the
    CUDA headers + libc10_cuda.so when both exist (then the CUDA-only sources are compiled in)."""
    import torch
    import torch.utils.cpp_extension as ext

    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    facts = {"torch": torch.__version__, "abi": int(bool(torch._C._GLIBCXX_USE_CXX11_ABI)),
             "include": ext.include_paths()[0], "lib": lib, "cuda_include": ""}
    if OBSERVER_CUDA_INPUTS and os.path.isfile(os.path.join(lib, "libc10_cuda.so")):
        # where the CUDA runtime headers are (tests/alloc_tracker_build.py looks in the same places)
        site = os.path.dirname(os.path.dirname(torch.__file__))
        cands = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include"), "/usr/local/cuda/include"]
        cands += [os.path.join(site, "nvidia", d, "include") for d in ("cu13", "cuda_runtime")]
        for cand in cands:
            if all(os.path.exists(os.path.join(cand, f)) for f in ("cuda_runtime_api.h", "crt/host_config.h")):
                facts["cuda_include"] = cand
                break
    return facts


def build_key(lib: Library, src: Path | None = None) -> tuple[str, dict]:
    """(key, facts): the hex key naming ``lib``'s cache folder, and the facts it covers."""
    src = src or source_dir()
    h = hashlib.sha256()
    names = lib.inputs + (OBSERVER_CUDA_INPUTS if lib is OBSERVER else ())
    for name in names:
        p = src / name
        h.update(name.encode() + b"\0")
        h.update(p.read_bytes() if p.is_file() else b"<missing>")
    facts = {"sources_sha256": h.hexdigest(),
             "compiler": _compiler_id(os.environ.get(lib.compiler_var, "c++" if lib.torch else "cc"))}
    if lib.torch:
        facts.update(torch_facts())
    k = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    return k, facts


def _private(path: Path, want_dir: bool) -> str:
    """'' when ``path`` is this user's and not writable by group or others (and a folder / a regular file as
    asked); else why not."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _ensure_root(root: Path) -> Path:
    """The cache root, created 0700 if missing; tightened to 0700 if it is ours but looser."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    why = _private(root, want_dir=True)
    st = os.lstat(root)
    if why and st.st_uid == os.geteuid() and stat.S_ISDIR(st.st_mode):
        os.chmod(root, 0o700)  # ours but open: close it; what is inside is checked file by file below
        why = ""
    if why:
        raise NativeBuildError(f"the build cache {root} is not private ({why}); set UVMPREFETCH_CACHE_DIR to a "
                               "folder of your own")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(root, 0o700)
    return root


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(folder: Path, lib: Library, key: str) -> str:
    """'' when ``folder`` holds a loadable build of ``lib`` with ``key``; else why it may not be loaded."""
    for p, is_dir in ((folder, True), (folder / lib.filename, False), (folder / "build.json", False)):
        why = _private(p, is_dir)
        if why:
            return f"{p.name}: {why}"
    try:
        rec = json.loads((folder / "build.json").read_text())
    except (OSError, ValueError) as e:
        return f"build.json unreadable: {e}"
    if rec.get("key") != key:
        return "recorded key differs"
    if rec.get("lib_sha256") != _sha256(folder / lib.filename):
        return "library does not match its recorded hash"
    return ""


def folder_for(lib: Library, key: str) -> Path:
    if lib is SHIM and os.environ.get("UVMPREFETCH_SHIM_DIR"):
        return Path(os.environ["UVMPREFETCH_SHIM_DIR"]) / f"shim-{key}"
    return cache_root() / f"{lib.name}-{key}"


def built(lib: Library) -> tuple[Path | None, str]:
    """(path, '') of an already built, verified ``lib``; (None, why) otherwise. Builds nothing."""
    try:
        key, _ = build_key(lib)
    except (NativeBuildError, ImportError, OSError) as e:
        return None, str(e)
    folder = folder_for(lib, key)
    why = verify(folder, lib, key)
    return (folder / lib.filename, "") if not why else (None, why)


def build(lib: Library, say=None) -> Path:
    """The path of a verified build of ``lib``, building it first when needed (``say(msg)``, if given, is told
    before a build starts: it takes seconds).

    Raises
    ------
    NativeBuildError
        No compiler or make, torch headers missing, the build failed (the compiler's last lines are in the
        message), or the cache is not private.
    """
    if shutil.which("make") is None:
        raise NativeBuildError("building native code needs `make` on PATH")
    src = source_dir()
    key, facts = build_key(lib, src)
    folder = folder_for(lib, key)
    if not verify(folder, lib, key):
        return folder / lib.filename
    root = _ensure_root(folder.parent)
    with open(_lock_path(root, lib), "a") as lock:  # two processes starting at once build it once
        fcntl.flock(lock, fcntl.LOCK_EX)
        why = verify(folder, lib, key)
        if not why:
            return folder / lib.filename
        if folder.exists() or folder.is_symlink():
            try:
                _remove(folder)
            except OSError:  # not ours to remove: build beside it, never load it
                folder = Path(tempfile.mkdtemp(prefix=f"{lib.name}-{key}-", dir=root))
        tmp = Path(tempfile.mkdtemp(prefix=f".{lib.name}-build-", dir=root))  # 0700
        if say is not None:
            say(f"building {lib.filename} for this {'torch ' + facts['torch'] if lib.torch else 'compiler'} "
                f"(once, into {root})")
        try:
            _make(lib, src, tmp, facts)
            rec = {"key": key, "lib_sha256": _sha256(tmp / lib.filename), **facts}
            (tmp / "build.json").write_text(json.dumps(rec, indent=1))
            os.chmod(tmp, 0o700)
            if folder.exists():  # the mkdtemp fallback above
                os.rmdir(folder)
            os.replace(tmp, folder)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    why = verify(folder, lib, key)
    if why:
        raise NativeBuildError(f"the fresh build of {lib.filename} in {folder} does not verify: {why}")
    return folder / lib.filename


def _lock_path(root: Path, lib: Library) -> Path:
    p = root / f".{lib.name}.lock"
    if p.is_symlink():
        p.unlink()
    return p


def _remove(folder: Path) -> None:
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    else:
        shutil.rmtree(folder)


def _make(lib: Library, src: Path, out: Path, facts: dict) -> None:
    cmd = ["make", "-s", "-C", str(src), f"O={out}"]
    if lib.target:
        cmd.append(lib.target)
    if lib.torch:
        cmd += [f"TORCH_INCLUDE={facts['include']}", f"TORCH_LIB={facts['lib']}", f"ABI={facts['abi']}"]
        if facts.get("cuda_include"):
            cmd += [f"CUDA_INCLUDE={facts['cuda_include']}", f"TORCH_VERSION={facts['torch']}"]
    if not os.path.isdir(facts.get("include", "/")):
        raise NativeBuildError(f"torch's C++ headers are missing ({facts['include']}): a torch wheel without "
                               "headers cannot build the observer")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not (out / lib.filename).is_file():
        lines = (r.stderr or r.stdout).strip().splitlines()
        errs = [ln for ln in lines if "error" in ln] or lines
        tail = " | ".join(errs[:2] + (errs[-1:] if len(errs) > 2 else []))
        raise NativeBuildError(f"building {lib.filename} failed (make exit {r.returncode}): {tail}")


__all__ = ["Library", "NativeBuildError", "OBSERVER", "SHIM", "build", "build_key", "built", "cache_root",
           "source_dir", "torch_facts", "verify"]
