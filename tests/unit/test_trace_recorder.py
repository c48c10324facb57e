"""GIVEN real transformers models WHEN recorded under the dispatch-mode recorder THEN the trace has the CUDA
kernels, phases, iterations, lifetimes and byte ranges a GPU run would have, and meta == real CPU tensors."""

import collections

import numpy as np
import pytest

from uvmprefetch.trace import KIND, PHASE, READ, WRITE, validate
from uvmprefetch.trace.models import record_model
from uvmprefetch.trace.recorder import Recorder
from uvmprefetch.trace.roofline import durations_for, estimate
from uvmprefetch.gpus import get_profile


@pytest.fixture(scope="module")
def tiny_meta():
    return record_model("gpt2", "tiny", batch=2, seq=32, iters=2, device="meta")


def _names(t):
    return [t.names[i] for i in t.launch_name]


def test_meta_and_cpu_traces_agree_event_for_event(tiny_meta):
    cpu = record_model("gpt2", "tiny", batch=2, seq=32, iters=2, device="cpu")
    assert _names(cpu) == _names(tiny_meta)
    assert cpu.alloc_size.tolist() == tiny_meta.alloc_size.tolist()
    assert cpu.alloc_at.tolist() == tiny_meta.alloc_at.tolist()
    assert cpu.free_at.tolist() == tiny_meta.free_at.tolist()
    assert cpu.free_rank.tolist() == tiny_meta.free_rank.tolist()
    assert cpu.equals(tiny_meta)  # every array: kinds, phases, accesses, exec ids, flops, durations


@pytest.mark.parametrize("model,kw", [("bert", dict(seq=16)), ("resnet", dict(image_size=32)),
                                      ("vit", dict(image_size=32))])
def test_meta_and_cpu_agree_for_other_families(model, kw):
    meta = record_model(model, "tiny", batch=2, iters=2, device="meta", **kw)
    cpu = record_model(model, "tiny", batch=2, iters=2, device="cpu", **kw)
    assert _names(cpu) == _names(meta) and cpu.equals(meta)


def test_cuda_kernels_not_the_cpu_math_path(tiny_meta):
    names = set(tiny_meta.names)
    assert {"aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_efficient_attention_backward",
            "aten::native_dropout", "aten::native_dropout_backward"} <= names
    assert "aten::bernoulli_" not in names and "aten::_softmax" not in names
    assert not any(n.startswith(("prim::", "profiler::")) for n in names)
    assert "aten::_foreach_addcdiv_.ScalarList" in names  # AdamW foreach, PyTorch's default on CUDA


def test_phases_iterations_and_kinds(tiny_meta):
    t = tiny_meta
    validate(t)
    assert t.iterations == 2 and np.all(np.diff(t.launch_iter) >= 0)
    for it in range(2):
        ph = t.launch_phase[t.launch_iter == it]
        # forward, then backward, then the optimizer step, in that order
        order = [PHASE["forward"], PHASE["backward"], PHASE["optimizer"]]
        firsts = [int(np.flatnonzero(ph == p)[0]) for p in order]
        assert firsts == sorted(firsts)
        assert ph[-1] == PHASE["optimizer"]
    n_params = t.meta["params"]
    alive = t.free_at < 0
    assert t.alloc_size[(t.alloc_kind == KIND["param"])].sum() == 4 * n_params
    assert t.alloc_size[alive & (t.alloc_kind == KIND["optimizer"])].sum() == 2 * 4 * n_params  # exp_avg, exp_avg_sq
    # grads of iteration 0 die at zero_grad(set_to_none) and are allocated again in iteration 1
    grads = t.alloc_kind == KIND["grad"]
    assert t.alloc_size[grads].sum() == 2 * 4 * n_params
    assert (t.alloc_kind == KIND["input"]).sum() == 2
    # the second iteration is steady: same kernels, same execution ids as the first
    e0, e1 = (t.launch_exec_id[(t.launch_iter == i) & (t.launch_phase != PHASE["optimizer"])] for i in (0, 1))
    assert e0.tolist() == e1.tolist()


def test_durations_are_the_roofline_of_flops_and_bytes(tiny_meta):
    t = tiny_meta
    h100 = get_profile("h100-pcie")
    assert np.allclose(t.launch_dur, durations_for(t, h100))
    i = int(np.argmax(t.launch_flops))
    assert t.launch_dur[i] == pytest.approx(estimate(t.launch_flops[i], t.launch_bytes[i], "fp32", h100))
    assert np.all(durations_for(t, "v100-pcie") >= durations_for(t, "h100-pcie"))
    assert t.launch_flops.sum() > 0


def test_roofline_regimes():
    h100 = get_profile("h100-pcie")
    # a big fp32 GEMM is compute bound at the fp32 (not TF32) peak; bf16 runs at the tensor-core peak
    flops, nbytes = 2 * 4096**3, 3 * 4096 * 4096 * 4
    fp32 = estimate(flops, nbytes, "fp32", h100)
    assert fp32 == pytest.approx(flops / (51e12 * h100.matmul_efficiency) + h100.launch_overhead_s)
    assert estimate(flops, nbytes // 2, "bf16", h100) < fp32 / 10
    # an elementwise op is bandwidth bound
    assert estimate(0, 1 << 30, "fp32", h100) == pytest.approx((1 << 30) / (2e12 * 0.8) + 4e-6)


def test_mixed_precision_uses_flash_attention_and_bf16_peaks():
    t = record_model("gpt2", "tiny", batch=2, seq=32, iters=1, dtype="bf16")
    names = set(t.names)
    assert "aten::_scaled_dot_product_flash_attention" in names
    assert "aten::_to_copy" in names  # weight casts
    assert [d for _, d in t.meta["flop_dtype_runs"]] == ["bf16"]
    # master weights and AdamW state stay fp32
    assert t.alloc_size[t.alloc_kind == KIND["param"]].sum() == 4 * t.meta["params"]


@pytest.mark.parametrize("model,kw,kernel", [
    ("bert", dict(seq=32), "aten::_scaled_dot_product_efficient_attention"),
    ("resnet", dict(image_size=32), "aten::convolution_backward"),
    ("vit", dict(image_size=32), "aten::_scaled_dot_product_efficient_attention_backward"),
    ("t5", dict(seq=32), "aten::_scaled_dot_product_efficient_attention_backward"),
])
def test_zoo_families_record(model, kw, kernel):
    t = record_model(model, "tiny", batch=2, iters=2, **kw)
    validate(t)
    assert t.iterations == 2 and kernel in t.names


def test_encoder_decoder_reads_the_encoder_output_in_every_decoder_layer_forward_and_backward():
    # GIVEN T5 (2 encoder and 2 decoder layers, d_model 64) on a 32-token source; the target defaults to a quarter
    t = record_model("t5", "tiny", batch=2, seq=32, iters=2)
    assert (t.meta["seq"], t.meta["target_seq"]) == (32, 8)
    assert record_model("t5", "tiny", batch=2, seq=32, target_seq=16, iters=1).meta["target_seq"] == 16
    # WHEN the reads of each activation in the steady iteration are counted by phase
    steady = np.flatnonzero(t.launch_iter == 1)
    reads = collections.defaultdict(collections.Counter)
    for i in steady:
        for j in range(t.acc_ptr[i], t.acc_ptr[i + 1]):
            if t.acc_mode[j] == READ and t.alloc_kind[t.acc_alloc[j]] == KIND["activation"]:
                reads[int(t.acc_alloc[j])][int(t.launch_phase[i])] += 1
    # THEN one source-sized activation (the encoder's output) is read by the key and value projections of both
    # decoder layers' cross-attention in the forward pass, and again by their weight gradients in the backward pass
    source = 2 * 32 * 64 * 4
    cross = [a for a, c in reads.items() if t.alloc_size[a] == source and c[PHASE["forward"]] == 2 * 2
             and c[PHASE["backward"]] == 2 * 2]
    assert len(cross) == 1
    # ... and the decoder's own activations are target-sized (a quarter of the source's)
    decoder = [a for a, c in reads.items() if t.alloc_size[a] == source // 4]
    assert decoder


def test_view_offsets_frees_and_modes():
    import torch

    with Recorder(device="meta") as rec:
        x = torch.zeros(100, 100, device="meta")  # 40,000 bytes
        y = x[10:20, 5:15]
        y.add_(1.0)  # a strided view: covers its span inside x's storage
        z = x.t()[3]  # column 3 of x: stride 100
        w = z * 2
        del x, y, z
        w.add_(1.0)
    t = rec.trace()
    names = _names(t)
    assert names == ["aten::zeros", "aten::add_.Tensor", "aten::mul.Tensor", "aten::add_.Tensor"]
    acc = t.accesses(1)
    assert t.acc_off[acc].tolist() == [(10 * 100 + 5) * 4]
    assert t.acc_len[acc].tolist() == [(9 * 100 + 9 + 1) * 4]
    assert t.acc_mode[acc].tolist() == [READ | WRITE]
    acc = t.accesses(2)
    assert t.acc_off[acc].tolist() == [3 * 4, 0] and t.acc_len[acc].tolist() == [(99 * 100 + 1) * 4, 400]
    assert t.acc_mode[acc].tolist() == [READ, WRITE]
    assert t.free_at[0] == 3 and t.free_at[1] == -1  # x's storage died (its views too) before launch 3
    assert t.iterations == 0 and (t.launch_iter == -1).all()  # no optimizer step: no complete iteration


def test_recorder_stops_after_max_iters():
    import torch

    stopped = []
    p = torch.nn.Parameter(torch.zeros(1000, device="meta"))
    opt = torch.optim.SGD([p], lr=0.1)
    with Recorder(device="meta", max_iters=2, on_stop=lambda: stopped.append(True)) as rec:
        for _ in range(4):
            (p * 2).sum().backward()
            opt.step()
    t = rec.trace()
    assert stopped == [True] and t.iterations == 2
    assert collections.Counter(t.launch_iter.tolist()).keys() == {0, 1}


@pytest.mark.slow
def test_gpt2_large_footprint_matches_the_arithmetic():
    t = record_model("gpt2", "large", batch=1, seq=128, iters=2)
    assert t.meta["params"] == 774_030_080  # GPT-2 large, tied embeddings
    from uvmprefetch.trace.stats import summarize
    s = summarize(t)
    p = 4 * t.meta["params"]
    assert s["param_bytes"] == p and s["gradient_bytes"] == p and s["optimizer_bytes"] == 2 * p
    assert s["peak_live_bytes"] >= 4 * p
    assert s["peak_live_bytes"] <= 4 * p + s["activation_peak_bytes"] + s["other_peak_bytes"] + s["input_bytes"]


@pytest.mark.parametrize("dtype,mask", [("float32", None), ("float32", "bool"), ("float32", "float"),
                                        ("bfloat16", None)])
def test_cpu_emulated_attention_kernels_compute_the_right_values(dtype, mask):
    """On real CPU tensors the CUDA attention kernels are emulated: outputs and gradients equal PyTorch's."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(2, 3, 16, 8, generator=g).to(dt).requires_grad_() for _ in range(3))
    m = None
    if mask == "bool":
        m = torch.rand(16, 16, generator=g) > 0.3
        m.fill_diagonal_(True)
    elif mask == "float":
        m = torch.randn(2, 1, 16, 16, generator=g)
    causal = mask is None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
    ref_grads = torch.autograd.grad(ref.float().square().sum(), (q, k, v))
    with Recorder(device="cpu") as rec:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal)
        grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    tol = dict(atol=2e-2, rtol=2e-2) if dt == torch.bfloat16 else dict(atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out, ref, **tol)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, **tol)
    kernel = "flash" if dt == torch.bfloat16 else "efficient"
    assert f"aten::_scaled_dot_product_{kernel}_attention" in rec.trace().names


def test_bad_recorder_arguments():
    from uvmprefetch.errors import ConfigError, RecordError

    with pytest.raises(RecordError, match="device 'tpu'"):
        Recorder(device="tpu")
    with pytest.raises(RecordError, match="measured durations need device='cuda'"):
        Recorder(device="meta", measure=True)
    with pytest.raises(RecordError, match="max_iters"):
        Recorder(max_iters=0)
    with pytest.raises(ConfigError, match="unknown GPU profile"):
        Recorder(gpu="tpu9")
