"""GIVEN the standard trace set WHEN asked for THEN missing traces are recorded once into the cache, named by a
hash of their arguments and the recorder version (so stale files are re-recorded), and bad names are refused."""

import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.trace import load
from uvmprefetch.trace import standard as S
from uvmprefetch.trace.models import ENCDEC, check_args


def test_set_covers_the_published_workloads():
    assert {"gpt2-large", "bert-large", "resnet-152", "vit-large", "t5-base"} <= set(S.STANDARD)
    assert all(kw["iters"] >= 3 for kw in S.STANDARD.values())
    assert any(kw["model"] in ENCDEC for kw in S.STANDARD.values())  # an encoder-decoder's cross-attention reuse


@pytest.mark.parametrize("name", list(S.STANDARD))
def test_every_entry_is_a_valid_recording(name):
    kw = dict(S.STANDARD[name])
    model, config = kw.pop("model"), kw.pop("config")
    check_args(model, config, batch=kw.pop("batch"), seq=kw.pop("seq", None), image_size=kw.pop("image_size", None),
               iters=kw.pop("iters"), dtype=kw.pop("dtype", "fp32"), target_seq=kw.pop("target_seq", None))
    assert not kw, f"{name}: arguments record_model's checks do not cover: {kw}"


def test_cache_records_once_and_names_by_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "STANDARD", {"tiny": dict(model="gpt2", config="tiny", batch=2, seq=16, iters=3)})
    paths = S.standard_traces(tmp_path, progress=False)
    assert [p.name for p in paths] == ["tiny.uvmt"] and paths[0].parent.parent == tmp_path
    t = load(paths[0])
    assert t.iterations == 3 and t.meta["name"] == "tiny"
    mtime = paths[0].stat().st_mtime_ns
    assert S.standard_traces(tmp_path, progress=False) == paths and paths[0].stat().st_mtime_ns == mtime
    # other arguments or another recorder version -> another file
    monkeypatch.setattr(S, "STANDARD", {"tiny": dict(model="gpt2", config="tiny", batch=4, seq=16, iters=3)})
    assert S.trace_path("tiny", tmp_path) != paths[0]
    monkeypatch.setattr(S, "STANDARD", {"tiny": dict(model="gpt2", config="tiny", batch=2, seq=16, iters=3)})
    monkeypatch.setattr(S, "RECORDER_VERSION", 999)
    assert S.trace_path("tiny", tmp_path) != paths[0]


def test_env_var_picks_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("UVMPREFETCH_TRACE_DIR", str(tmp_path / "c"))
    assert S.cache_dir() == tmp_path / "c"
    assert S.trace_path("gpt2-large").is_relative_to(tmp_path / "c")


def test_unknown_name_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown standard trace"):
        S.standard_traces(tmp_path, names=["gpt5"])
