"""Changing-pattern traces: well-formed, the pattern really changes, and ``uvmprefetch`` recovers from it."""

import numpy as np
import pytest

from uvmprefetch.errors import ConfigError
from uvmprefetch.sim.layout import build_layout
from uvmprefetch.sim.replay import replay
from uvmprefetch.trace.format import validate
from uvmprefetch.trace.patterns import alternating_seq, batch_change, encoder_decoder, moe, periodic_eval

SMALL = dict(layers=4, param_bytes=8 << 20)


def _iter_blocks(t, k):
    lay = build_layout(t)
    idx = np.flatnonzero(t.launch_iter == k)
    return set(np.concatenate([lay.launch_blocks(int(i)) for i in idx]).tolist())


def test_traces_are_valid_and_change():
    a = alternating_seq(iterations=4, **SMALL)
    validate(a)
    assert a.iterations == 4
    # the two sequence lengths give different activation sizes -> different exec ids, same kernel names
    e0 = set(a.launch_exec_id[a.launch_iter == 0].tolist())
    e1 = set(a.launch_exec_id[a.launch_iter == 1].tolist())
    e2 = set(a.launch_exec_id[a.launch_iter == 2].tolist())
    assert e0 != e1 and e0 == e2
    m = moe(iterations=3, experts=4, top_k=1, **SMALL)
    validate(m)
    assert _iter_blocks(m, 0) != _iter_blocks(m, 1)  # other experts, other weights
    p = periodic_eval(iterations=4, every=3, **SMALL)
    validate(p)
    assert (p.launch_phase[p.launch_iter == 3] == 4).all()  # the 4th step is an eval pass
    b = batch_change(iterations=4, at=2, **SMALL)
    validate(b)
    assert b.meta["pattern"]["changes"] == [2]


@pytest.mark.parametrize("call", [lambda: alternating_seq(iterations=1), lambda: batch_change(iterations=4, at=4),
                                  lambda: moe(top_k=9, experts=8), lambda: periodic_eval(every=0),
                                  lambda: alternating_seq(layers=0), lambda: encoder_decoder(dec_layers=0),
                                  lambda: encoder_decoder(layers=12)])
def test_bad_arguments_raise_config_error(call):
    with pytest.raises(ConfigError):
        call()


@pytest.mark.slow
@pytest.mark.parametrize("make,oversub", [(lambda: alternating_seq(iterations=6, **SMALL), 2.0),
                                          (lambda: batch_change(iterations=6, at=3, **SMALL), 2.0),
                                          # the default sizes (the scorecard's, bench/ablation.py): a jump of the
                                          # pointer two iterations back once cost the second B step 14 %
                                          (lambda: alternating_seq(), 2.0), (lambda: alternating_seq(), 3.0)])
def test_recovers_within_two_iterations_and_never_loses_to_demand(make, oversub):
    t = make()
    changes = t.meta["pattern"]["changes"]
    ours = replay(t, "uvmprefetch", "h100-pcie-lit", oversub=oversub)
    dem = replay(t, "demand", "h100-pcie-lit", oversub=oversub)
    assert ours["time_s"] <= 1.05 * dem["time_s"]
    it = ours["iteration_times_s"]
    # steady state of a kind of iteration = its last occurrence; two iterations after each change we are
    # within 10 % of it (the cold first iteration is not a change)
    for c in changes:
        k = c + 2
        if k >= len(it):
            continue
        same_kind = [j for j in range(k, len(it)) if (j - k) % 2 == 0] if "alternating" in t.meta["model"] \
            else list(range(k, len(it)))
        assert it[k] <= 1.10 * it[same_kind[-1]] + 1e-12, (c, it)


def _encoder_output(t, lay, launches):
    """The blocks every ``dec_cross`` launch among ``launches`` reads (the encoder's output), and the launches that
    touch the encoder output's allocation."""
    cross = [i for i in launches if t.names[t.launch_name[i]] == "dec_cross"]
    blocks = set.intersection(*(set(lay.launch_blocks(int(i)).tolist()) for i in cross))
    alloc = set.intersection(*(set(t.acc_alloc[t.acc_ptr[i]:t.acc_ptr[i + 1]].tolist()) for i in cross))
    uses = [i for i in launches if alloc & set(t.acc_alloc[t.acc_ptr[i]:t.acc_ptr[i + 1]].tolist())]
    return np.array(sorted(blocks)), cross, uses


def test_encoder_decoder_reads_the_encoder_output_in_every_decoder_layer():
    t = encoder_decoder(iterations=2, enc_layers=3, dec_layers=4)
    validate(t)
    lay = build_layout(t)
    blocks, cross, uses = _encoder_output(t, lay, np.flatnonzero(t.launch_iter == 1))
    # one source-sized tensor (1024 tokens x 64 KiB: 32 blocks), read by the 4 cross parts forward, then by each
    # cross part's two gradient launches (its weight's and its input's)
    assert len(cross) == 4 and blocks.size == 32
    names = [t.names[t.launch_name[i]] for i in uses]
    assert names.count("dec_cross") == 4 and names.count("dec_cross_bwdw") == 4 and names.count("dec_cross_bwdx") == 4
    assert names[0] == "enc" and names[-1] == "dec_cross_bwdx"  # written by the encoder, last read in backward


@pytest.mark.parametrize("oversub", [2.0, 3.0])
def test_the_encoder_output_stays_on_the_gpu_across_the_decoder(oversub):
    # GIVEN an encoder-decoder whose every decoder layer reads the encoder's output, forward and backward, short of
    # memory (the source's activations dominate)
    t = encoder_decoder()
    lay = build_layout(t)
    steady = np.flatnonzero(t.launch_iter == t.iterations - 1)
    blocks, _, uses = _encoder_output(t, lay, steady)

    def refetched(policy):
        r = replay(t, policy, "h100-pcie", oversub=oversub, layout=lay, timeline=True)
        comp = {i: (s, e) for s, e, i, _ in r["timeline"]["compute"]}
        first_end, last_start = comp[uses[0]][1], comp[uses[-1]][0]
        n = 0
        for ids, landed, _ in r["timeline"]["block"]:
            sel = np.isin(ids, blocks)
            n += int(((landed[sel] > first_end) & (landed[sel] < last_start)).sum())
        return n, r

    # WHEN uvmprefetch, the oracle and DeepUM run it
    ours, r = refetched("uvmprefetch")
    _, o = refetched("oracle")
    theirs, _ = refetched("deepum")
    # THEN in the steady iteration uvmprefetch never brings the encoder's output back between its first and its last
    # use (DeepUM does: its correlation tables lose it behind the decoder's weights), and runs level with the oracle
    assert ours == 0 and theirs > 0
    assert r["steady_slowdown"] <= 1.02 * o["steady_slowdown"]
