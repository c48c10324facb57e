"""Synthetic training-loop traces for tests and for benchmarking the simulator itself.

Not a stand-in for recorded models (``uvmprefetch record`` makes those): a layered network with the
memory behaviour that matters to unified memory — persistent weights, gradients and Adam state, forward
activations that live until the backward pass frees them, short-lived temporaries — so the simulator can
be exercised without the recorder.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..trace.format import READ, WRITE, Trace, TraceBuilder


def training_trace(layers: int = 8, param_bytes: int = 8 << 20, act_bytes: int = 6 << 20, iterations: int = 2,
                   small_bytes: int = 64 << 10, bw: float = 1.6e12, overhead: float = 5e-6) -> Trace:
    """A ``layers``-deep training loop, ``iterations`` steps of forward, backward, AdamW.

    Each launch's duration is ``overhead + bytes touched / bw`` (a memory-bound roofline).

    Raises
    ------
    ConfigError
        If a size or count is not positive.
    """
    for name, v in (("layers", layers), ("param_bytes", param_bytes), ("act_bytes", act_bytes),
                    ("iterations", iterations), ("small_bytes", small_bytes)):
        if v <= 0:
            raise ConfigError(f"synthetic trace: {name} must be positive, got {v}")
    b = TraceBuilder(meta={"model": f"synthetic-{layers}x{param_bytes >> 20}MiB", "durations": "estimated"})

    def launch(name, acc, phase):
        nbytes = sum(ln for _, _, ln, _ in acc)
        b.launch(name, acc, duration=overhead + nbytes / bw, phase=phase)

    w = [b.alloc(param_bytes, "param") for _ in range(layers)]
    bias = [b.alloc(small_bytes, "param") for _ in range(layers)]
    grads: list[int] = []
    adam: list[tuple[int, int]] = []
    x = b.alloc(act_bytes, "input")
    for it in range(iterations):
        b.iteration = it
        acts = [x]
        for i in range(layers):  # forward: y = f(W x + b)
            y = b.alloc(act_bytes, "activation")
            launch(f"fwd{i}", [(w[i], 0, param_bytes, READ), (bias[i], 0, small_bytes, READ),
                               (acts[-1], 0, act_bytes, READ), (y, 0, act_bytes, WRITE)], "forward")
            acts.append(y)
        loss = b.alloc(small_bytes, "activation")
        launch("loss", [(acts[-1], 0, act_bytes, READ), (loss, 0, small_bytes, WRITE)], "forward")
        g = b.alloc(act_bytes, "activation")
        launch("loss_bwd", [(loss, 0, small_bytes, READ), (g, 0, act_bytes, WRITE)], "backward")
        b.free(loss)
        for i in reversed(range(layers)):  # backward: dW, db, dx
            if it == 0:
                grads.append(b.alloc(param_bytes, "grad"))
            gi = grads[layers - 1 - i]
            tmp = b.alloc(small_bytes, "activation")
            launch(f"bwdw{i}", [(g, 0, act_bytes, READ), (acts[i], 0, act_bytes, READ), (gi, 0, param_bytes, WRITE),
                                (tmp, 0, small_bytes, WRITE)], "backward")
            gx = b.alloc(act_bytes, "activation")
            launch(f"bwdx{i}", [(g, 0, act_bytes, READ), (w[i], 0, param_bytes, READ), (tmp, 0, small_bytes, READ),
                                (gx, 0, act_bytes, WRITE)], "backward")
            b.free(tmp)
            b.free(g)
            if i > 0:
                b.free(acts[i + 1])
            g = gx
        b.free(acts[1])
        b.free(g)
        for i in range(layers):  # AdamW
            if it == 0:
                adam.append((b.alloc(param_bytes, "optimizer"), b.alloc(param_bytes, "optimizer")))
            m, v = adam[i]
            gi = grads[layers - 1 - i]
            launch(f"adam{i}", [(w[i], 0, param_bytes, READ | WRITE), (gi, 0, param_bytes, READ),
                                (m, 0, param_bytes, READ | WRITE), (v, 0, param_bytes, READ | WRITE)], "optimizer")
    return b.build()
