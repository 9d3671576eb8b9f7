"""Symlm: causality of every variant, cache == no-cache generation, adaptive softmax, configs."""

import pytest
import torch

from rpc_attention.models.lm import (
    AdaptiveLogSoftmax, LM_CONFIGS, Symlm, build_lm, generate, lm_config, parse_rpc_layers,
)
from rpc_attention.nn import Attention, RPCAttention, SymmetricAttention

V = 60

VARIANTS = {
    "symmetric": dict(attention="symmetric"),
    "asymmetric": dict(attention="asymmetric"),
    "rpc-first": dict(attention="symmetric", rpc_layers=[0], n_iter=4),
    "rpc-all": dict(attention="symmetric", rpc_layers="all", n_iter=3),
    "rpc-asym-rest": dict(attention="asymmetric", rpc_layers=[1], n_iter=2, mu_mode="causal_head_dim"),
}


def tiny(variant: str, dropout: float = 0.1, context: int = 16, **kw) -> Symlm:
    torch.manual_seed(0)
    opts = dict(vocab_size=V, n_layer=2, d_model=32, n_head=4, d_inner=48, context=context, dropout=dropout,
                attn_dropout=dropout, cutoffs=[10, 30])
    opts.update(VARIANTS[variant])
    opts.update(kw)
    return build_lm(None, **opts)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("train", [False, True])
def test_no_output_depends_on_a_later_token(variant, train):
    model = tiny(variant)
    model.train(train)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, V, (3, 16), generator=g)
    for t in (1, 7, 15):
        y = x.clone()
        y[:, t:] = torch.randint(0, V, (3, 16 - t), generator=g)
        outs = []
        for inp in (x, y):
            torch.manual_seed(123)  # same dropout masks for both inputs
            outs.append(model(inp))
        # bit-identical by construction: same kernels on the same shapes, later tokens only add exact zeros
        assert torch.equal(outs[0][:, :t], outs[1][:, :t]), f"{variant}: output before {t} saw a later token"
        assert not torch.allclose(outs[0][:, t:], outs[1][:, t:]), "later outputs should change"
        # per-token log-probabilities of earlier targets are unaffected too
        torch.manual_seed(5)
        lp_x = model(x, x.roll(-1, 1))
        torch.manual_seed(5)
        lp_y = model(y, x.roll(-1, 1))
        assert torch.equal(lp_x[:, :t], lp_y[:, :t])


def test_global_mu_is_rejected_for_a_causal_lm():
    with pytest.raises(ValueError, match="leak"):
        lm_config(None, vocab_size=V, n_layer=2, rpc_layers=[0], mu_mode="global")


@pytest.mark.parametrize("variant", ["symmetric", "asymmetric", "rpc-first", "rpc-all"])
def test_greedy_generation_identical_with_and_without_cache(variant):
    model = tiny(variant, dropout=0.0, context=12).eval()
    with torch.no_grad():  # make the model less degenerate than at init so that paths are non-trivial
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(3))
    # 20 new words > context 12: covers the window crop and re-encoding
    a = generate(model, prompt, 20, temperature=0, use_cache=True)
    b = generate(model, prompt, 20, temperature=0, use_cache=False)
    assert torch.equal(a, b)
    # sampling with the same seed also matches
    s1 = generate(model, prompt, 15, temperature=1.0, top_k=10, use_cache=True,
                  generator=torch.Generator().manual_seed(9))
    s2 = generate(model, prompt, 15, temperature=1.0, top_k=10, use_cache=False,
                  generator=torch.Generator().manual_seed(9))
    assert torch.equal(s1, s2)
    assert len(set(s1[:, 5:].flatten().tolist())) > 5, "degenerate continuation makes the test weak"


@pytest.mark.parametrize("variant", ["symmetric", "asymmetric", "rpc-all"])
def test_cached_step_log_probs_match_full_forward(variant):
    model = tiny(variant, dropout=0.0).eval()
    x = torch.randint(0, V, (2, 10), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model.next_logprob(x[:, :4], cache)]
        for i in range(4, 10):
            steps.append(model.next_logprob(x[:, i:i + 1], cache))
        for j, lp in enumerate(steps):
            full = model.next_logprob(x[:, :4 + j])
            # float32, different shapes: rounding of a few eps of the log-prob scale (measured <= 1.4 eps
            # max|log p| over 5 seeds, 1-2 threads)
            atol = 16 * torch.finfo(torch.float32).eps * full.abs().max().item()
            torch.testing.assert_close(lp, full, rtol=0, atol=atol)
    assert cache_length(cache) == 10


def test_adaptive_softmax_normalised_and_consistent():
    torch.manual_seed(0)
    crit = AdaptiveLogSoftmax(V, 16, [10, 30, 100000], own_weight=True)  # 100000 clipped
    assert crit.bounds == [0, 10, 30, V] and crit.n_clusters == 2
    with torch.no_grad():
        crit.cluster_weight.normal_()
        crit.bias.normal_()
    h = torch.randn(7, 16, dtype=torch.float64)
    crit = crit.double()
    full = crit.full_logprob(h)
    assert full.shape == (7, V)
    torch.testing.assert_close(full.logsumexp(-1), torch.zeros(7, dtype=torch.float64), rtol=0, atol=1e-12)
    tgt = torch.tensor([0, 9, 10, 29, 30, 59, 45])
    torch.testing.assert_close(crit.target_logprob(h, tgt), full.gather(1, tgt[:, None]).squeeze(1))
    # reference: explicit two-level factorisation for a tail word
    head = torch.log_softmax(torch.cat([h @ crit.weight[:10].T + crit.bias[:10],
                                        h @ crit.cluster_weight.T + crit.cluster_bias], -1), -1)
    tail = torch.log_softmax(h @ crit.weight[30:].T + crit.bias[30:], -1)
    torch.testing.assert_close(full[:, 45], head[:, 11] + tail[:, 15])
    with pytest.raises(ValueError, match="targets"):
        crit.target_logprob(h, torch.tensor([V] * 7))


def test_full_softmax_when_cutoffs_exceed_vocab():
    m = build_lm("symlm-small", vocab_size=V, n_layer=1)
    assert m.crit.n_clusters == 0 and m.config.effective_cutoffs == []
    m2 = build_lm(None, vocab_size=V, n_layer=1, d_model=16, n_head=2, d_inner=16, adaptive=False, cutoffs=[10])
    assert m2.crit.n_clusters == 0


def test_tied_embeddings_share_storage():
    m = tiny("symmetric")
    assert m.out_weight is m.tok_emb.weight
    x = torch.randint(0, V, (1, 8))
    m(x, x).sum().backward()
    assert m.tok_emb.weight.grad is not None


def test_named_configs_follow_the_paper():
    small = build_lm("symlm-small", vocab_size=1000, rpc_layers="0-3", n_iter=4)
    c = small.config
    assert (c.n_layer, c.d_model, c.n_head, c.d_inner, c.context, c.dropout) == (16, 128, 8, 2048, 256, 0.1)
    assert c.cutoffs == [20000, 40000, 200000]
    kinds = [type(b.attn) for b in small.blocks]
    assert kinds[:4] == [RPCAttention] * 4 and kinds[4:] == [SymmetricAttention] * 12
    assert all(b.attn.n_iter == 4 and b.attn.mu_mode == "causal" for b in small.blocks[:4])
    assert small.blocks[5].attn.qkv.weight.shape == (256, 128)  # no W_Q
    med = lm_config("symlm-medium", vocab_size=1000)
    assert (med.d_model, med.context, med.n_head) == (256, 384, 8)
    asym = build_lm(None, vocab_size=50, n_layer=2, d_model=16, n_head=2, d_inner=16, attention="asymmetric")
    assert isinstance(asym.blocks[0].attn, Attention) and asym.blocks[0].attn.qkv.weight.shape == (48, 16)
    assert set(LM_CONFIGS) == {"symlm-small", "symlm-medium"}


def test_config_validation():
    assert parse_rpc_layers("0-3", 16) == [0, 1, 2, 3]
    assert parse_rpc_layers("all", 3) == [0, 1, 2]
    assert parse_rpc_layers([2, 0], 3) == [0, 2]
    assert parse_rpc_layers(None, 3) == []
    with pytest.raises(ValueError, match="out of range"):
        parse_rpc_layers([16], 16)
    with pytest.raises(ValueError, match="unknown Symlm option"):
        lm_config(None, vocab_size=10, bogus=1)
    with pytest.raises(ValueError, match="divisible"):
        lm_config(None, vocab_size=10, d_model=30, n_head=4)
    with pytest.raises(ValueError, match="lambd"):
        lm_config(None, vocab_size=10, rpc_layers=[0], lambd=-1)
    m = tiny("symmetric", context=8)
    with pytest.raises(ValueError, match="context"):
        m(torch.zeros(1, 9, dtype=torch.long))
