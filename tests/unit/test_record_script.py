"""GIVEN unmodified scripts that use cuda in the usual ways WHEN recorded with record_script THEN every form
of "put it on the GPU" lands on meta, read-backs give fake values, and recording stops after N steps."""

import textwrap

import pytest

from uvmprefetch.errors import RecordError
from uvmprefetch.trace import KIND
from uvmprefetch.trace.script import record_script


def _script(tmp_path, body):
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent(body))
    return p


def test_device_forms_readbacks_and_disk_data(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.ones(16, 16)}, tmp_path / "init.pt")
    p = _script(tmp_path, f"""
        import sys, torch
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1
        dev = torch.device("cuda:0")
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(dev)
        state = torch.load({str(tmp_path / 'init.pt')!r}, map_location="cuda")
        assert state["w"].is_meta
        with torch.no_grad():
            model[0].weight.copy_(state["w"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        torch.set_default_device("cuda")
        bias = torch.zeros(4)                              # default device
        assert bias.is_meta
        for step in range(100):
            x = torch.randn(8, 16, device="cuda")          # device= kwarg
            y = torch.randint(0, 4, (8,)).cuda()           # .cuda()
            loss = torch.nn.functional.cross_entropy(model(x) + bias, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            assert loss.item() == 1.0 and not bool(torch.isnan(loss))
            assert loss.detach().cpu().numpy().shape == () and model(x).argmax(1).tolist() == [0] * 8
            print("step", step, sys.argv[1:])
    """)
    t = record_script(p, ["--flag"], iters=3)
    assert t.iterations == 3
    assert t.meta["args"] == ["--flag"]
    names = set(t.names)
    assert any(n.startswith("aten::_foreach_") for n in names)  # SGD picked foreach, as for CUDA params
    assert (t.alloc_kind == KIND["param"]).sum() == 4 and (t.alloc_kind == KIND["optimizer"]).sum() == 4
    import torch as T
    assert not T.empty(1).is_meta  # the default device was restored


def test_stops_cleanly_even_if_the_script_catches_exceptions(tmp_path):
    p = _script(tmp_path, """
        import torch
        w = torch.nn.Parameter(torch.zeros(10, device="cuda"))
        opt = torch.optim.AdamW([w])
        for _ in range(50):
            try:
                (w * 2).sum().backward()
                opt.step()
            except Exception:
                raise SystemExit("swallowed")
    """)
    t = record_script(p, iters=2)
    assert t.iterations == 2


def test_script_without_steps_is_an_error(tmp_path):
    p = _script(tmp_path, "import torch\nx = torch.ones(2, device='cuda') + 1\n")
    with pytest.raises(RecordError, match="no optimizer step"):
        record_script(p)
