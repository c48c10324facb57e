"""The native builder's cache (``runtime/native.py``): private, keyed, and never a way to load someone's code.

GIVEN a build cache of our own (``UVMPREFETCH_CACHE_DIR``) and the shim (the quickest library to build; the
C++ observer goes through the same code),
WHEN a library in it was changed, opened to others, or handed to another owner, or the cache folder itself is
open or foreign,
THEN the builder rebuilds (never loads) the library, closes a folder of ours that was open, refuses a foreign
one with one line, and keys builds by their sources so that an edited source never loads a stale build.
"""

import hashlib
import json
import os
import shutil
import stat

import pytest

from uvmprefetch.runtime import native

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("UVMPREFETCH_CACHE_DIR", str(root))
    monkeypatch.delenv("UVMPREFETCH_SHIM_DIR", raising=False)
    return root


def sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_build_is_private_and_recorded(cache):
    lib = native.build(native.SHIM)
    assert lib.parent.parent == cache and stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(lib.parent).st_mode) == 0o700
    rec = json.loads((lib.parent / "build.json").read_text())
    assert rec["lib_sha256"] == sha(lib) and rec["key"] in lib.parent.name
    assert native.built(native.SHIM) == (lib, "")
    assert native.build(native.SHIM) == lib  # built once: the second call loads the verified build


@pytest.mark.parametrize("tamper", ["bytes", "mode", "owner", "record"])
def test_a_library_that_does_not_verify_is_rebuilt_never_loaded(cache, tamper):
    lib = native.build(native.SHIM)
    good = sha(lib)
    if tamper == "bytes":
        with open(lib, "ab") as f:
            f.write(b"\x90" * 16)  # someone's code appended
    elif tamper == "mode":
        os.chmod(lib, 0o777)
    elif tamper == "owner":
        if os.geteuid() != 0:
            pytest.skip("only root can hand a file to another owner")
        os.chown(lib, 12345, 12345)
    else:
        rec = json.loads((lib.parent / "build.json").read_text())
        rec["key"] = "0" * 16
        (lib.parent / "build.json").write_text(json.dumps(rec))
    path, why = native.built(native.SHIM)
    assert path is None and why  # says why it may not be loaded
    again = native.build(native.SHIM)
    assert again == lib and sha(again) == good and native.verify(lib.parent, native.SHIM, lib.parent.name[5:]) == ""
    assert os.stat(again).st_uid == os.geteuid() and not os.stat(again).st_mode & 0o022


def test_an_open_cache_of_ours_is_closed_a_foreign_one_refused(cache):
    cache.mkdir(mode=0o777)
    os.chmod(cache, 0o777)
    native.build(native.SHIM)
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    if os.geteuid() != 0:
        pytest.skip("only root can hand a folder to another owner")
    shutil.rmtree(cache)
    cache.mkdir()
    os.chown(cache, 12345, 12345)
    with pytest.raises(native.NativeBuildError, match="not private.*owned by uid 12345"):
        native.build(native.SHIM)


def test_builds_are_keyed_by_their_sources(cache, tmp_path, monkeypatch):
    k1, _ = native.build_key(native.SHIM)
    src = tmp_path / "kernels"
    shutil.copytree(native.source_dir(), src)
    (src / "uvmshim.c").write_text((src / "uvmshim.c").read_text() + "\n/* edited */\n")
    k2, _ = native.build_key(native.SHIM, src)
    assert k1 != k2
