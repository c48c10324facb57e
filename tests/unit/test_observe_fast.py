"""The live observer's fast path against the original, obvious implementation (kept here as the reference):
on every op of a tiny GPT-2, BERT and ResNet-style training step, the flat argument walk must give the same
accesses, shape keys, execution ids and FLOP counts as ``tree_flatten``, and a whole session must hand the
backend the same launches as the original ``on_op``."""

import os

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode

from uvmprefetch.config import RuntimeConfig
from uvmprefetch.runtime.session import Session
from uvmprefetch.trace import ops as R
from uvmprefetch.trace.format import PHASE, READ, WRITE, exec_id_of

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ----------------------------------------------------------------------------- the reference (original code)
def ref_accesses_of(func, args, kwargs, out, device_type):
    res = []
    mutable = R._mutable_args(func)
    for i, a in enumerate(args):
        mode = READ | WRITE if i in mutable else READ
        for t in tree_flatten(a)[0]:
            if isinstance(t, torch.Tensor):
                res.append((t, mode))
    for k, a in (kwargs or {}).items():
        mode = READ | WRITE if k in mutable else READ
        for t in tree_flatten(a)[0]:
            if isinstance(t, torch.Tensor):
                res.append((t, mode))
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            res.append((t, WRITE))
    return [(t, m) for t, m in res if t.layout == torch.strided and t.device.type == device_type]


def ref_shape_key(args, kwargs):
    key = []
    for x in tree_flatten((args, kwargs))[0]:
        if isinstance(x, torch.Tensor):
            key.append((tuple(x.shape), str(x.dtype)[6:]))
        elif isinstance(x, (bool, int)):
            key.append(x)
    return tuple(key)


def ref_tensor_extent(t):
    """By brute force: the lowest and the highest storage offset over every element of ``t``."""
    es = t.element_size()
    if t.numel() == 0:
        return t.storage_offset() * es, 0
    offs = np.zeros((), dtype=np.int64)
    for n, st in zip(t.shape, t.stride()):
        offs = np.add.outer(offs, np.arange(n, dtype=np.int64) * st)
    lo, hi = int(offs.min()), int(offs.max())
    return (t.storage_offset() + lo) * es, (hi - lo + 1) * es


# ----------------------------------------------------------------------------- tiny models
def gpt2_step():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=128, n_positions=16, bos_token_id=0,
                     eos_token_id=0, attn_implementation="eager")
    m = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16))
    return m, opt, lambda: m(input_ids=ids, labels=ids).loss


def bert_step():
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=128, max_position_embeddings=16, attn_implementation="sdpa")
    m = BertForSequenceClassification(cfg)
    opt = torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9)
    ids, mask = torch.randint(0, 128, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    labels = torch.tensor([0, 1])
    return m, opt, lambda: m(input_ids=ids, attention_mask=mask, labels=labels).loss


def resnet_step():
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
            self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

        def forward(self, x):
            return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))

    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      Block(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    x, y = torch.randn(2, 3, 16, 16), torch.tensor([1, 7])
    return m, opt, lambda: torch.nn.functional.cross_entropy(m(x), y)


class Compare(TorchDispatchMode):
    """Runs every op, then compares fast and reference observation on it (for launching and non-launching
    ops alike: the walk must be right whatever the op)."""

    def __init__(self):
        super().__init__()
        self.ops, self.mismatches, self.flop_ops, self.names = 0, [], 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.names.add(func.name())
        ref_acc = ref_accesses_of(func, args, kwargs, out, "cpu")
        acc, key, ckey = R.scan_op(func, args, kwargs, out, "cpu")
        same = lambda a, b: len(a) == len(b) and all(x is y and m == n for (x, m), (y, n) in zip(a, b))  # noqa: E731
        if not same(acc, ref_acc):
            self.mismatches.append(("scan_op accesses", func.name()))
        if not same(R.accesses_of(func, args, kwargs, out, "cpu"), ref_acc):
            self.mismatches.append(("accesses_of", func.name()))
        ref_key = ref_shape_key(args, kwargs)
        if key != ref_key or R._shape_key(args, kwargs) != ref_key or repr(key) != repr(ref_key):
            self.mismatches.append(("shape key", func.name()))
        name = func.name()
        if R.cached_exec_id(name, key, ckey) != exec_id_of(name, ref_key):
            self.mismatches.append(("exec id", name))
        ref_flops = R.flops_of(func, args, kwargs, out)
        self.flop_ops += ref_flops > 0
        for _ in range(2):  # the second call answers from the cache when the counter is shape-only
            if R.cached_flops(func, args, kwargs, out, ckey) != ref_flops:
                self.mismatches.append(("flops", name))
        for t, _ in ref_acc:
            if R.tensor_extent(t) != ref_tensor_extent(t):
                self.mismatches.append(("extent", name))
        return out


@pytest.mark.parametrize("build", [gpt2_step, bert_step, resnet_step])
def test_fast_observation_matches_reference(build):
    torch.manual_seed(0)
    model, opt, loss_fn = build()
    cmp = Compare()
    with cmp:
        for _ in range(2):  # the second step hits the per-shape caches
            loss_fn().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert cmp.ops > 200
    assert cmp.flop_ops > 0  # matmuls / convolutions were counted, so the FLOP cache was exercised
    assert not cmp.mismatches, cmp.mismatches[:10]


def test_walk_edge_cases():
    """Arguments the walk hands to ``tree_flatten`` (torch.Size, dicts, nested lists, structseq outputs) and
    bool vs int in the cache key (equal as dict keys, different execution ids)."""
    a, b = torch.ones(2, 3), torch.zeros(3)
    for args, kwargs in [((a, [b, None, [a]], torch.Size([2, 3])), {"k": {"x": b}}),
                         ((a, (1, True, 2.5), "s", torch.float16), {}),
                         (([[a, b], (a,)],), {"dim": 1, "keepdim": False})]:
        assert R._shape_key(args, kwargs) == ref_shape_key(args, kwargs)
        f = torch.ops.aten.add.Tensor
        acc, key, _ = R.scan_op(f, args, kwargs, torch.return_types.max((a, b)), "cpu")
        ref = ref_accesses_of(f, args, kwargs, torch.return_types.max((a, b)), "cpu")
        assert [(id(t), m) for t, m in acc] == [(id(t), m) for t, m in ref]
        assert key == ref_shape_key(args, kwargs)
    f = torch.ops.aten.sum.dim_IntList
    _, k1, c1 = R.scan_op(f, (a, [1], True), {}, a.sum(1, True), "cpu")
    _, k2, c2 = R.scan_op(f, (a, [1], 1), {}, a.sum(1, True), "cpu")
    assert c1 != c2
    assert R.cached_exec_id(f.name(), k1, c1) == exec_id_of(f.name(), k1)
    assert R.cached_exec_id(f.name(), k2, c2) == exec_id_of(f.name(), k2) != exec_id_of(f.name(), k1)
    # non-contiguous, transposed, expanded and empty views
    base = torch.arange(24.0).reshape(2, 3, 4)
    for t in (base.transpose(0, 2), base[:, 1], base[..., ::2], b.expand(4, 3), base[:, :0], base[1:]):
        assert R.tensor_extent(t) == ref_tensor_extent(t)


# ----------------------------------------------------------------------------- whole session
class RecordingBackend:
    name = "record"
    virtual_addresses = True
    device_type = "cpu"
    block_size = 4096
    capacity_bytes = 1 << 30
    gpu = None

    def __init__(self):
        self.launches, self.frees = [], []

    def block_ids(self, start, length):
        return np.arange(start // 4096, (start + max(length, 1) - 1) // 4096 + 1, dtype=np.int64)

    def free(self, blocks):
        self.frees.append(blocks.tolist())

    def launch(self, info):
        self.launches.append((info.index, info.exec_id, info.name, info.phase, info.iteration, info.duration,
                              info.blocks.tolist(), info.write_blocks.tolist(), str(info.blocks.dtype)))

    def end_iteration(self, k):
        pass

    def close(self):
        pass


class ReferenceSession(Session):
    """The original ``on_op``, verbatim apart from the reference helpers."""

    def on_op(self, func, args, kwargs, out, backward):
        from uvmprefetch.policy.base import LaunchInfo
        with self._lock:
            if not self.active:
                return
            self._drain_frees()
            acc = ref_accesses_of(func, args, kwargs, out, self.device_type)
            if not acc:
                return
            phase = "optimizer" if self.in_optimizer else "backward" if backward else "forward"
            if phase == "optimizer" and all(t.dim() == 0 for t, _ in acc):
                return
            blocks, writes = [], []
            for t, mode in acc:
                s = self.tracker.lookup(t.untyped_storage())
                if s is None:
                    continue
                off, length = ref_tensor_extent(t)
                length = min(length, s.nbytes - off)
                if length <= 0:
                    continue
                ids = self.backend.block_ids(s.base + off, length)
                blocks.append(ids)
                if mode & WRITE:
                    writes.append(ids)
            b = np.unique(np.concatenate(blocks)) if blocks else np.zeros(0, dtype=np.int64)
            w = np.unique(np.concatenate(writes)) if writes else np.zeros(0, dtype=np.int64)
            name = func.name()
            nid = self.names.setdefault(name, len(self.names))
            info = LaunchInfo(index=self.index, exec_id=exec_id_of(name, ref_shape_key(args, kwargs)),
                              name=nid, phase=PHASE[phase], iteration=self.iteration, duration=0.0,
                              blocks=b, write_blocks=w)
            self.backend.launch(info)
            self.index += 1


def _run_session(cls, observer="python"):  # (the Python observer's fast path against its reference)
    torch.manual_seed(0)
    model, opt, loss_fn = gpt2_step()
    backend = RecordingBackend()
    cfg = RuntimeConfig(enabled=True, backend="dryrun", policy="demand", observer=observer)
    s = cls(cfg, backend=backend, dormant=False).start()
    try:
        for _ in range(2):
            loss_fn().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        s.stop()
    return backend


def test_session_launches_match_reference_session():
    fast, ref = _run_session(Session), _run_session(ReferenceSession)
    assert len(fast.launches) > 100
    assert fast.launches == ref.launches
    assert fast.frees == ref.frees
