"""The robustness cases of the prefetcher: traces whose access pattern *changes* during the run, and one whose
reuse the standard traces' architectures lack.

Each builder makes a layered training loop (weights, gradients, AdamW state, activations that live from
forward to backward) with a per-iteration *schedule*, so that what a prefetcher learned in one iteration
is wrong, or only partly right, in the next:

- ``alternating_seq``: sequence length (activation size) alternates between two values every iteration.
- ``periodic_eval``: an evaluation pass (forward only, no gradients, different batch) every ``every`` steps.
- ``batch_change``: the batch size (activation size) changes once, mid-run.
- ``moe``: mixture-of-experts layers; each step routes to a data-dependent (seeded random) subset of
  experts, so the same kernels touch different weights from step to step.

And one whose pattern does not change but whose reuse the others lack:

- ``encoder_decoder``: an encoder over a long source, a decoder over a short target whose every layer's
  cross-attention reads the encoder's output, in the forward pass and again in the backward pass, where each
  layer adds to the gradient of the encoder's output (T5, BART, Whisper-style training).

They are synthetic (``TraceBuilder``), with execution ids from kernel name + access sizes (DeepUM's
definition: the same kernel with other shapes is another execution id). Durations follow a roofline:
``overhead + max(bytes / bw, flops / flops_rate)`` with ``flops = 2 * weight_bytes/4 * tokens``.
``steady`` in ``trace.meta['pattern']`` names the iterations where the pattern changes (for recovery plots).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .format import READ, WRITE, Trace, TraceBuilder, exec_id_of


class _Loop:
    """Shared mechanics: a ``layers``-deep MLP-like network trained with AdamW."""

    def __init__(self, layers: int, param_bytes: int, experts: int, bw: float, flops: float, overhead: float,
                 meta: dict) -> None:
        for name, v in (("layers", layers), ("param_bytes", param_bytes), ("experts", experts)):
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"pattern trace: {name} must be a positive integer, got {v!r}")
        self.b = TraceBuilder(meta=meta)
        self.layers, self.pb, self.bw, self.fl, self.ov = layers, param_bytes, bw, flops, overhead
        self.w = [[self.b.alloc(param_bytes, "param") for _ in range(experts)] for _ in range(layers)]
        self.g: list[list[int]] | None = None
        self.adam: list[list[tuple[int, int]]] | None = None

    def _launch(self, name: str, acc, tokens: int, weight_bytes: int, phase: str) -> None:
        nbytes = sum(a[2] for a in acc)
        dur = self.ov + max(nbytes / self.bw, 2.0 * (weight_bytes / 4) * tokens / self.fl)
        eid = exec_id_of(name, [a[2] for a in acc])
        self.b.launch(name, acc, duration=dur, exec_id=eid, phase=phase)

    def step(self, it: int, act_bytes: int, tokens: int, experts_used: list[list[int]], train: bool = True) -> None:
        b, L, pb = self.b, self.layers, self.pb
        b.iteration = it
        x = b.alloc(act_bytes, "input")
        self._launch("load", [(x, 0, act_bytes, WRITE)], 0, 0, "forward" if train else "eval")
        acts = [x]
        phase = "forward" if train else "eval"
        for i in range(L):
            y = b.alloc(act_bytes, "activation")
            acc = [(self.w[i][e], 0, pb, READ) for e in experts_used[i]]
            self._launch(f"fwd{i % 2}", acc + [(acts[-1], 0, act_bytes, READ), (y, 0, act_bytes, WRITE)], tokens,
                         pb * len(experts_used[i]), phase)
            acts.append(y)
            if not train:
                b.free(acts[-2])
                acts = [y]
        if not train:
            b.free(acts[-1])
            return
        if self.g is None:
            self.g = [[b.alloc(pb, "grad") for _ in row] for row in self.w]
        g = b.alloc(act_bytes, "activation")
        self._launch("loss", [(acts[-1], 0, act_bytes, READ), (g, 0, act_bytes, WRITE)], 0, 0, "backward")
        for i in reversed(range(L)):
            ex = experts_used[i]
            acc = [(self.g[i][e], 0, pb, READ | WRITE) for e in ex]
            self._launch(f"bwdw{i % 2}", acc + [(g, 0, act_bytes, READ), (acts[i], 0, act_bytes, READ)], tokens,
                         pb * len(ex), "backward")
            gx = b.alloc(act_bytes, "activation")
            acc = [(self.w[i][e], 0, pb, READ) for e in ex]
            self._launch(f"bwdx{i % 2}", acc + [(g, 0, act_bytes, READ), (gx, 0, act_bytes, WRITE)], tokens,
                         pb * len(ex), "backward")
            b.free(g)
            b.free(acts[i + 1])
            g = gx
        b.free(g)
        b.free(acts[0])
        self.adamw([(i, e) for i in range(L) for e in experts_used[i]])

    def adamw(self, used: list[tuple[int, int]]) -> None:
        """The optimizer step over the weights ``used`` (layer, expert): AdamW's two moments, allocated at the first
        step for every weight (as PyTorch's lazy state), read and written with the weight and its gradient."""
        b, pb = self.b, self.pb
        if self.adam is None:
            self.adam = [[(b.alloc(pb, "optimizer"), b.alloc(pb, "optimizer")) for _ in row] for row in self.w]
        for i, e in used:
            m, v = self.adam[i][e]
            self._launch("adamw", [(self.w[i][e], 0, pb, READ | WRITE), (self.g[i][e], 0, pb, READ | WRITE),
                                   (m, 0, pb, READ | WRITE), (v, 0, pb, READ | WRITE)], 0, 0, "optimizer")

    def build(self) -> Trace:
        return self.b.build()


_DEF = dict(layers=12, param_bytes=24 << 20, bw=1.6e12, flops=60e12, overhead=5e-6)


def _check_iters(iterations: int, least: int) -> None:
    if not isinstance(iterations, int) or iterations < least:
        raise ConfigError(f"pattern trace: iterations must be an integer >= {least}, got {iterations!r}")


def alternating_seq(iterations: int = 8, seq: tuple[int, int] = (512, 1024), token_bytes: int = 16 << 10,
                    **kw) -> Trace:
    """Sequence length alternates ``seq[0], seq[1], seq[0], ...`` every iteration.

    Raises
    ------
    ConfigError
        On a non-positive size or fewer than 2 iterations.
    """
    _check_iters(iterations, 2)
    if min(seq) <= 0 or token_bytes <= 0:
        raise ConfigError("alternating_seq: seq lengths and token_bytes must be positive")
    p = {**_DEF, **kw}
    lp = _Loop(p["layers"], p["param_bytes"], 1, p["bw"], p["flops"], p["overhead"],
               {"model": "pattern-alternating-seq", "durations": "estimated",
                "pattern": {"kind": "alternating_seq", "changes": list(range(1, iterations))}})
    for it in range(iterations):
        s = seq[it % 2]
        lp.step(it, s * token_bytes, s, [[0]] * p["layers"])
    return lp.build()


def periodic_eval(iterations: int = 9, every: int = 3, seq: int = 1024, eval_seq: int = 2048,
                  token_bytes: int = 16 << 10, **kw) -> Trace:
    """Training steps with an evaluation pass (forward only, larger batch) after every ``every`` steps.

    Raises
    ------
    ConfigError
        On bad counts or sizes.
    """
    _check_iters(iterations, 2)
    if every <= 0 or seq <= 0 or eval_seq <= 0:
        raise ConfigError("periodic_eval: every, seq and eval_seq must be positive")
    p = {**_DEF, **kw}
    changes = []
    lp = _Loop(p["layers"], p["param_bytes"], 1, p["bw"], p["flops"], p["overhead"],
               {"model": "pattern-periodic-eval", "durations": "estimated"})
    it = 0
    for k in range(iterations):
        train = not ((k + 1) % (every + 1) == 0)
        if not train:
            changes.append(it)
        s = seq if train else eval_seq
        lp.step(it, s * token_bytes, s, [[0]] * p["layers"], train=train)
        it += 1
    lp.b.meta["pattern"] = {"kind": "periodic_eval", "changes": changes}
    return lp.build()


def batch_change(iterations: int = 8, at: int = 4, batch: tuple[int, int] = (8, 12), seq: int = 128,
                 token_bytes: int = 16 << 10, **kw) -> Trace:
    """Batch size ``batch[0]`` for iterations ``< at``, ``batch[1]`` from ``at`` on.

    Raises
    ------
    ConfigError
        If ``at`` is not inside the run or a size is not positive.
    """
    _check_iters(iterations, 2)
    if not 0 < at < iterations:
        raise ConfigError(f"batch_change: at must be in 1..{iterations - 1}, got {at}")
    if min(batch) <= 0 or seq <= 0:
        raise ConfigError("batch_change: batch sizes and seq must be positive")
    p = {**_DEF, **kw}
    lp = _Loop(p["layers"], p["param_bytes"], 1, p["bw"], p["flops"], p["overhead"],
               {"model": "pattern-batch-change", "durations": "estimated",
                "pattern": {"kind": "batch_change", "changes": [at]}})
    for it in range(iterations):
        bsz = batch[0] if it < at else batch[1]
        lp.step(it, bsz * seq * token_bytes, bsz * seq, [[0]] * p["layers"])
    return lp.build()


def moe(iterations: int = 8, experts: int = 8, top_k: int = 2, seq: int = 1024, token_bytes: int = 16 << 10,
        seed: int = 0, **kw) -> Trace:
    """Mixture-of-experts: each layer has ``experts`` weight sets; each step uses a random ``top_k`` of them.

    Raises
    ------
    ConfigError
        If ``top_k`` is not in ``1..experts``.
    """
    _check_iters(iterations, 2)
    if not 1 <= top_k <= experts:
        raise ConfigError(f"moe: top_k must be in 1..{experts}, got {top_k}")
    p = {**_DEF, **kw}
    p["param_bytes"] = p["param_bytes"] // 2
    rng = np.random.default_rng(seed)
    lp = _Loop(p["layers"], p["param_bytes"], experts, p["bw"], p["flops"], p["overhead"],
               {"model": "pattern-moe", "durations": "estimated",
                "pattern": {"kind": "moe", "changes": list(range(1, iterations))}})
    for it in range(iterations):
        used = [sorted(rng.choice(experts, size=top_k, replace=False).tolist()) for _ in range(p["layers"])]
        lp.step(it, seq * token_bytes, seq, used)
    return lp.build()


def encoder_decoder(iterations: int = 6, enc_layers: int = 6, dec_layers: int = 6, src: int = 1024, tgt: int = 256,
                    token_bytes: int = 64 << 10, **kw) -> Trace:
    """An encoder-decoder: ``enc_layers`` layers over a ``src``-token source, then ``dec_layers`` decoder layers over
    a ``tgt``-token target, each a self part and a cross-attention part that reads the encoder's output (alive from
    the encoder's last layer to the end of the backward pass). Backward: every decoder layer's cross part reads the
    encoder's output again and adds to its gradient, which then flows into the encoder. ``layers`` is not taken (the
    two depths are). Activations are 4x the other patterns' per token: the source's dominate, as in T5 training.

    Raises
    ------
    ConfigError
        On a non-positive depth or size, or fewer than 2 iterations.
    """
    _check_iters(iterations, 2)
    for name, v in (("enc_layers", enc_layers), ("dec_layers", dec_layers), ("src", src), ("tgt", tgt),
                    ("token_bytes", token_bytes)):
        if not isinstance(v, int) or v <= 0:
            raise ConfigError(f"encoder_decoder: {name} must be a positive integer, got {v!r}")
    if "layers" in kw:
        raise ConfigError("encoder_decoder: give enc_layers and dec_layers, not layers")
    p = {**_DEF, **kw}
    # weights: the encoder's layers, then per decoder layer its self part and its cross part
    lp = _Loop(enc_layers + 2 * dec_layers, p["param_bytes"], 1, p["bw"], p["flops"], p["overhead"],
               {"model": "pattern-encoder-decoder", "durations": "estimated",
                "pattern": {"kind": "encoder_decoder", "changes": []}})
    for it in range(iterations):
        _encdec_step(lp, it, (enc_layers, dec_layers), src, tgt, token_bytes)
    return lp.build()


def _encdec_step(lp: _Loop, it: int, depth: tuple[int, int], src: int, tgt: int, token_bytes: int) -> None:
    """One training step of ``encoder_decoder`` on ``lp``'s weights."""
    b, pb = lp.b, lp.pb
    ne, nd = depth
    sb, tb = src * token_bytes, tgt * token_bytes
    b.iteration = it
    w = [row[0] for row in lp.w]
    if lp.g is None:
        lp.g = [[b.alloc(pb, "grad")] for _ in w]
    g = [row[0] for row in lp.g]
    self_w, cross_w = range(ne, ne + 2 * nd, 2), range(ne + 1, ne + 2 * nd, 2)

    def fwd(name, wi, reads, size):
        y = b.alloc(size, "activation")
        lp._launch(name, [(w[wi], 0, pb, READ)] + [(x, 0, n, READ) for x, n in reads] + [(y, 0, size, WRITE)],
                   reads[0][1] // token_bytes, pb, "forward")
        return y

    def bwd(name, wi, grad, reads, size):
        """The weight's gradient and the input's (a new tensor of ``size``; None: not wanted)."""
        acc = [(x, 0, n, READ) for x, n in reads]
        tokens = reads[0][1] // token_bytes
        lp._launch(name + "w", [(g[wi], 0, pb, READ | WRITE), grad] + acc, tokens, pb, "backward")
        if size is None:
            return None
        gx = b.alloc(size, "activation")
        lp._launch(name + "x", [(w[wi], 0, pb, READ), grad] + acc + [(gx, 0, size, WRITE)], tokens, pb, "backward")
        return gx

    x = b.alloc(sb, "input")
    lp._launch("load_src", [(x, 0, sb, WRITE)], 0, 0, "forward")
    enc = [x]
    for i in range(ne):
        enc.append(fwd("enc", i, [(enc[-1], sb)], sb))
    out = enc[-1]  # the encoder's output: read by every decoder layer's cross-attention
    d = b.alloc(tb, "input")
    lp._launch("load_tgt", [(d, 0, tb, WRITE)], 0, 0, "forward")
    dec = [d]  # the decoder's inputs and, per layer, its self part's output and its cross part's
    for j in range(nd):
        h = fwd("dec_self", self_w[j], [(dec[-1], tb)], tb)
        dec += [h, fwd("dec_cross", cross_w[j], [(h, tb), (out, sb)], tb)]
    gy = b.alloc(tb, "activation")
    lp._launch("loss", [(dec[-1], 0, tb, READ), (gy, 0, tb, WRITE)], 0, 0, "backward")
    g_out = b.alloc(sb, "activation")  # the gradient of the encoder's output: every cross part adds to it
    lp._launch("zero", [(g_out, 0, sb, WRITE)], 0, 0, "backward")
    for j in reversed(range(nd)):
        grad = (gy, 0, tb, READ)
        lp._launch("dec_cross_bwd_enc", [(w[cross_w[j]], 0, pb, READ), grad, (g_out, 0, sb, READ | WRITE)], tgt, pb,
                   "backward")
        gh = bwd("dec_cross_bwd", cross_w[j], grad, [(dec[2 * j + 1], tb), (out, sb)], tb)
        b.free(gy)
        b.free(dec[2 * j + 2])
        gd = bwd("dec_self_bwd", self_w[j], (gh, 0, tb, READ), [(dec[2 * j], tb)], tb)
        b.free(gh)
        b.free(dec[2 * j + 1])
        gy = gd
    b.free(gy)
    b.free(dec[0])
    for i in reversed(range(ne)):
        gx = bwd("enc_bwd", i, (g_out, 0, sb, READ), [(enc[i], sb)], sb)
        b.free(g_out)
        b.free(enc[i + 1])
        g_out = gx
    b.free(g_out)
    b.free(enc[0])
    lp.adamw([(i, 0) for i in range(len(w))])


def pattern_traces() -> dict[str, Trace]:
    """The robustness set at its default sizes: the four changing-pattern traces and ``encoder_decoder``."""
    return {"alternating_seq": alternating_seq(), "periodic_eval": periodic_eval(), "batch_change": batch_change(),
            "moe": moe(), "encoder_decoder": encoder_decoder()}
