"""The model zoo of ``uvmprefetch record --model``: published architectures from ``transformers``' own classes,
built from a config with random weights (never a hub download), trained with AdamW.

Decoder-only (GPT-2), encoder-only (BERT, ViT), convolutional (ResNet) and encoder-decoder (T5): an
encoder-decoder reads a ``--seq``-token source and writes a ``--target-seq``-token target (default a quarter of the
source, as in summarisation); every decoder layer's cross-attention reads the encoder's output, in the forward pass
and again in the backward pass.

``record_model`` records ``iters`` training iterations (forward, backward, ``AdamW.step``) of one of them.
"""

from __future__ import annotations

import os

from ..errors import ConfigError, RecordError
from ..gpus import DEFAULT_GPU, get_profile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random init only: never reach for the hub
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# family -> config name -> transformers config keyword arguments.
CONFIGS: dict[str, dict[str, dict]] = {
    "gpt2": {
        "small": dict(n_embd=768, n_layer=12, n_head=12),
        "medium": dict(n_embd=1024, n_layer=24, n_head=16),
        "large": dict(n_embd=1280, n_layer=36, n_head=20),
        "xl": dict(n_embd=1600, n_layer=48, n_head=25),
        "tiny": dict(n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128),  # tests
    },
    "bert": {
        "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     vocab_size=512, max_position_embeddings=128),
    },
    "resnet": {
        "50": dict(depths=[3, 4, 6, 3]),
        "101": dict(depths=[3, 4, 23, 3]),
        "152": dict(depths=[3, 8, 36, 3]),
        "tiny": dict(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=16),
    },
    "t5": {  # T5 v1 (ReLU feed-forward, relative position bias); encoder and decoder each num_layers deep
        "small": dict(d_model=512, num_layers=6, num_heads=8, d_ff=2048, d_kv=64),
        "base": dict(d_model=768, num_layers=12, num_heads=12, d_ff=3072, d_kv=64),
        "large": dict(d_model=1024, num_layers=24, num_heads=16, d_ff=4096, d_kv=64),
        "tiny": dict(d_model=64, num_layers=2, num_heads=4, d_ff=128, d_kv=16, vocab_size=512),
    },
    "vit": {
        "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
        "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
        "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                     image_size=32, patch_size=8),
    },
}
TEXT = {"gpt2": 1024, "bert": 512, "t5": 512}  # default --seq (an encoder-decoder's source)
ENCDEC = ("t5",)  # default --target-seq: a quarter of the source
IMAGE = {"resnet": 224, "vit": 224}  # default --image-size
DTYPES = ("fp32", "bf16", "fp16")


def target_len(model: str, seq: int | None, target_seq: int | None) -> int | None:
    """The target length of an encoder-decoder (``target_seq``, else a quarter of the source); None for others."""
    if model not in ENCDEC:
        return None
    return target_seq or max(1, (seq or TEXT[model]) // 4)


def check_args(model: str, config: str, *, batch: int, seq: int | None, image_size: int | None, iters: int,
               dtype: str, target_seq: int | None = None) -> None:
    """Validate ``record_model``'s arguments.

    Raises
    ------
    ConfigError
        Naming the bad argument and the accepted values.
    """
    if model not in CONFIGS:
        raise ConfigError(f"--model {model!r}: unknown; valid: {', '.join(CONFIGS)}")
    if str(config) not in CONFIGS[model]:
        raise ConfigError(f"--config {config!r}: unknown for {model}; valid: {', '.join(CONFIGS[model])}")
    if not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--batch must be a positive integer, got {batch!r}")
    if iters < 1:
        raise ConfigError(f"--iters must be >= 1, got {iters}")
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r}: valid: {', '.join(DTYPES)}")
    if model in TEXT:
        if image_size is not None:
            raise ConfigError(f"--image-size does not apply to {model} (a text model): use --seq")
        if seq is not None and seq < 1:
            raise ConfigError(f"--seq must be a positive integer, got {seq}")
        if target_seq is not None and model not in ENCDEC:
            raise ConfigError(f"--target-seq applies to encoder-decoder models ({', '.join(ENCDEC)}), not {model}")
        if target_seq is not None and target_seq < 1:
            raise ConfigError(f"--target-seq must be a positive integer, got {target_seq}")
        cfg = _hf_config(model, str(config))
        limit = cfg.n_positions if model == "gpt2" else getattr(cfg, "max_position_embeddings", None)
        for flag, n in (("--seq", seq), ("--target-seq", target_seq)):
            if n is not None and limit is not None and n > limit:  # (T5's relative positions have no limit)
                raise ConfigError(f"{flag} {n} exceeds {model}-{config}'s {limit} positions")
    else:
        for flag, n in (("--seq", seq), ("--target-seq", target_seq)):
            if n is not None:
                raise ConfigError(f"{flag} does not apply to {model} (an image model): use --image-size")
        if image_size is not None and (image_size < 32 or (model == "vit" and image_size % 16)):
            raise ConfigError(f"--image-size {image_size}: must be >= 32" + (" and a multiple of 16" if model == "vit"
                                                                          else ""))


def _hf_config(model: str, config: str):
    import transformers as tf

    kw = dict(CONFIGS[model][config])
    if model == "gpt2":
        return tf.GPT2Config(**kw)
    if model == "bert":
        return tf.BertConfig(**kw)
    if model == "t5":
        return tf.T5Config(decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **kw)  # (as published)
    if model == "resnet":
        kw.setdefault("layer_type", "bottleneck")
        return tf.ResNetConfig(num_labels=1000, **kw)
    kw.setdefault("image_size", 224)
    return tf.ViTConfig(num_labels=1000, **kw)


def build_model(model: str, config: str, device: str = "meta"):
    """A randomly initialised ``transformers`` model in training mode, its parameters on ``device``."""
    import torch
    import transformers as tf

    cfg = _hf_config(model, str(config))
    if model != "resnet":
        cfg._attn_implementation = "sdpa"
    cls = {"gpt2": tf.GPT2LMHeadModel, "bert": tf.BertForMaskedLM, "resnet": tf.ResNetForImageClassification,
           "vit": tf.ViTForImageClassification, "t5": tf.T5ForConditionalGeneration}[model]
    torch.manual_seed(0)
    with torch.device(device):
        m = cls(cfg)
    return m.train()


def make_batch(model: str, net, *, batch: int, seq: int | None, image_size: int | None, device: str,
               target_seq: int | None = None) -> dict:
    """Random inputs and labels for one training step (created on ``device``, as a data loader's batch
    would be after its host-to-device copy). An encoder-decoder gets a source and target labels; the model
    makes its decoder inputs from the labels (shifted right)."""
    import torch

    cfg = net.config
    if model in ENCDEC:
        return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq or TEXT[model]), device=device),
                "labels": torch.randint(0, cfg.vocab_size, (batch, target_len(model, seq, target_seq)),
                                        device=device)}
    if model == "gpt2":
        ids = torch.randint(0, cfg.vocab_size, (batch, seq or TEXT[model]), device=device)
        return {"input_ids": ids, "labels": ids}
    if model == "bert":
        s = seq or TEXT[model]
        return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, s), device=device),
                "labels": torch.randint(0, cfg.vocab_size, (batch, s), device=device)}
    size = image_size or (cfg.image_size if model == "vit" else IMAGE[model])
    return {"pixel_values": torch.randn(batch, 3, size, size, device=device),
            "labels": torch.randint(0, 1000, (batch,), device=device)}


def autocast_like(dtype: str):
    """Mixed precision as CUDA autocast does it, for devices autocast does not cover (meta): matmuls,
    convolutions and linear layers run in ``dtype`` (weights cast once per region, the fp32 master weights
    stay), layer norm / softmax / losses in fp32, everything else by type promotion."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_map

    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    to_low = {F.linear, torch.addmm, torch.mm, torch.bmm, torch.baddbmm, torch.matmul, torch.Tensor.matmul,
              torch.Tensor.__matmul__, F.conv1d, F.conv2d, torch.conv2d, torch.einsum}
    to_fp32 = {F.layer_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
               torch.Tensor.softmax, torch.Tensor.log_softmax, F.cross_entropy, F.nll_loss, F.mse_loss}

    class AutocastLike(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.cache: dict = {}

        def _low(self, x):
            if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
                return x
            if x.is_leaf and x.requires_grad:  # autocast caches the casts of weights within a region
                c = self.cache.get(id(x))
                if c is None or c[0] is not x:
                    c = self.cache[id(x)] = (x, x.to(low))
                return c[1]
            return x.to(low)

        @staticmethod
        def _fp32(x):
            return x.float() if isinstance(x, torch.Tensor) and x.dtype == low else x

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in to_low:
                args, kwargs = tree_map(self._low, (args, kwargs))
            elif func in to_fp32:
                args, kwargs = tree_map(self._fp32, (args, kwargs))
            return func(*args, **kwargs)

    return AutocastLike()


def record_model(model: str, config: str, *, batch: int, seq: int | None = None, image_size: int | None = None,
                 iters: int = 2, dtype: str = "fp32", gpu: str = DEFAULT_GPU, device: str = "meta",
                 progress: bool = False, lr: float = 1e-4, target_seq: int | None = None, foreach: bool = True):
    """Record ``iters`` training iterations (forward, backward, AdamW step) of a zoo model.

    Parameters
    ----------
    model, config : str
        Family and size, e.g. ``("gpt2", "large")``; see ``CONFIGS``.
    batch : int
        Batch size.
    seq, image_size : int, optional
        Sequence length (text models; an encoder-decoder's source) or image side (image models); defaults per
        family.
    target_seq : int, optional
        An encoder-decoder's target length (default: a quarter of the source).
    iters : int
        Training iterations to record (the first is not steady state: optimizer state appears in it).
    dtype : str
        'fp32', or 'bf16'/'fp16' mixed precision (fp32 master weights and AdamW state).
    gpu : str
        GPU profile the durations are estimated for.
    device : str
        'meta' (no memory, the default), 'cpu' (real tensors, real arithmetic: slow, for tests) or 'cuda'
        (a real GPU: durations measured with CUDA events instead of estimated).
    progress : bool
        Show a progress bar on stderr.
    foreach : bool
        AdamW's multi-tensor path (PyTorch's default on CUDA: one op over every parameter); False: one op per
        parameter (``foreach=False``, what ``bench/gpu/train_worker.py --foreach off`` trains with).

    Returns
    -------
    Trace

    Raises
    ------
    ConfigError
        Bad model, config, shape or dtype.
    RecordError
        The model failed to run under the recorder.
    """
    import contextlib

    import torch

    from .recorder import Recorder

    check_args(model, str(config), batch=batch, seq=seq, image_size=image_size, iters=iters, dtype=dtype,
               target_seq=target_seq)
    get_profile(gpu)
    if device not in ("meta", "cpu", "cuda"):
        raise ConfigError(f"device {device!r}: record_model runs on meta, cpu or cuda")
    net = build_model(model, str(config), device)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, foreach=bool(foreach))  # foreach: PyTorch's default on CUDA
    params = list(net.parameters())
    meta = {"model": model, "config": str(config), "name": f"{model}-{config}", "batch": batch,
            "seq": (seq or TEXT[model]) if model in TEXT else None, "target_seq": target_len(model, seq, target_seq),
            "image_size": (image_size or (net.config.image_size if model == "vit" else IMAGE[model]))
            if model in IMAGE else None, "dtype": dtype,
            "optimizer": "AdamW(foreach)" if foreach else "AdamW(for-loop)",
            "params": int(sum(p.numel() for p in params))}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iters, desc=f"record {model}-{config}", unit="iter", leave=False, disable=None)
    rec = Recorder(device=device, gpu=gpu, meta=meta, progress=bar)
    try:
        with rec:
            rec.register(params, "param")
            rec.register(list(net.buffers()), "param")
            for _ in range(iters):
                inputs = make_batch(model, net, batch=batch, seq=seq, image_size=image_size, device=device,
                                    target_seq=target_seq)
                rec.tag(inputs.values(), "input")
                with autocast_like(dtype) if dtype != "fp32" else contextlib.nullcontext():
                    loss = net(**inputs).loss
                rec.tag(inputs.values(), "input")
                loss.backward()
                del loss, inputs
                opt.step()
                opt.zero_grad(set_to_none=True)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        raise RecordError(f"recording {model}-{config} failed: {str(e).splitlines()[0]}") from e
    finally:
        if bar is not None:
            bar.close()
    return rec.trace()
