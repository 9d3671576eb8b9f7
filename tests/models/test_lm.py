"""Symlm: causality of every variant, cache == no-cache generation, adaptive softmax, configs."""

import pytest
import torch
from torch import Tensor

import rpc_attention.functional as RF
from rpc_attention.models.lm import (
    LM_CONFIGS,
    AdaptiveLogSoftmax,
    Symlm,
    build_lm,
    cache_length,
    generate,
    lm_config,
    parse_rpc_layers,
    reorder_cache,
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


def _perturbed(model: Symlm) -> Symlm:
    with torch.no_grad():  # less degenerate than at init, so that PAP's sparse step fires
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def _cached_logprobs(model: Symlm, x: Tensor, prompt: int) -> Tensor:
    cache = model.new_cache()
    steps = [model.next_logprob(x[:, :prompt], cache)]
    steps += [model.next_logprob(x[:, i:i + 1], cache) for i in range(prompt, x.shape[1])]
    assert cache_length(cache) == x.shape[1]
    return torch.stack(steps, 1)


def _uncached_logprobs(model: Symlm, x: Tensor, prompt: int) -> Tensor:
    return torch.stack([model.next_logprob(x[:, :i]) for i in range(prompt, x.shape[1] + 1)], 1)


CACHE_CASES = [
    *[dict(rpc_layers=[0], n_iter=n, threshold="lambda_mu", mu_mode="causal") for n in range(1, 7)],
    dict(rpc_layers="all", n_iter=4, threshold="lambda_over_mu", lambd=1.0, mu_mode="causal_head_dim"),
    dict(rpc_layers="all", n_iter=3, threshold="candes", lambd=1.0, mu_mode="causal"),
    dict(rpc_layers=[1], n_iter=2, threshold="candes", lambd=1.0, mu_mode="causal_head_dim", attention="asymmetric"),
    dict(rpc_layers="all", n_iter=2, lambd=float("inf")),
]


@pytest.mark.parametrize("opts", CACHE_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_pap_cache_equals_the_uncached_forward_in_float64(opts):
    # float64: the cached passes differ from the uncached ones by rounding only (~1e-15 per pass, see
    # tests/functional/reference.py); 1e-10 on log-probabilities is far above it
    model = _perturbed(tiny("symmetric", dropout=0.0, **opts)).double()
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(_cached_logprobs(model, x, 5), _uncached_logprobs(model, x, 5), rtol=0, atol=1e-10)
    if opts.get("lambd", 4.0) != float("inf"):
        assert 0.0 < _sparse_fraction(model, x) < 1.0


def _sparse_fraction(model: Symlm, x: Tensor) -> float:
    attn = next(b.attn for b in model.blocks if isinstance(b.attn, RPCAttention))
    seen = []
    hook = attn.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    with torch.no_grad():
        model(x)
    hook.remove()
    k, v = attn._split(seen[0])
    opts = {key: val for key, val in attn.pap_options().items() if key != "checkpoint_iters"}
    state = RF.pap_decompose(k, v, is_causal=True, **opts)
    return float((state.sparse != 0).double().mean())


def test_pap_cache_float32_agrees_within_rounding_and_greedy_tokens_match():
    model = _perturbed(tiny("symmetric", dropout=0.0, rpc_layers="0", n_iter=4, context=24))
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = _uncached_logprobs(model, x, 5)
        # float32 through 2 blocks and 4 PAP passes: the measured gap is a few eps of the log-prob
        # scale; 64 eps leaves room for other CPUs and thread counts
        atol = 64 * torch.finfo(torch.float32).eps * full.abs().max().item()
        torch.testing.assert_close(_cached_logprobs(model, x, 5), full, rtol=0, atol=atol)
    prompt = x[:, :5]
    assert torch.equal(generate(model, prompt, 15, temperature=0, use_cache=True),
                       generate(model, prompt, 15, temperature=0, use_cache=False))


def test_reordered_cache_continues_the_selected_rows():
    model = _perturbed(tiny("symmetric", dropout=0.0, rpc_layers="all", n_iter=3)).double()
    x = torch.randint(0, V, (3, 10), generator=torch.Generator().manual_seed(6))
    index = torch.tensor([2, 2, 0])
    with torch.no_grad():
        cache = model.new_cache()
        model.next_logprob(x[:, :6], cache)
        reorder_cache(cache, index)
        xr = x.index_select(0, index)
        xr[1, 6:] = x[1, 6:]  # two beams from row 2 continue differently
        steps = [model.next_logprob(xr[:, i:i + 1], cache) for i in range(6, 10)]
        full = _uncached_logprobs(model, xr, 7)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-10)


def test_cached_generation_after_save_and_reload(tmp_path):
    from safetensors.torch import load_file, save_file

    model = _perturbed(tiny("symmetric", dropout=0.0, rpc_layers="0", n_iter=4))
    save_file(model.state_dict(), str(tmp_path / "m.safetensors"))
    again = tiny("symmetric", dropout=0.0, rpc_layers="0", n_iter=4).eval()
    again.load_state_dict(load_file(str(tmp_path / "m.safetensors")))
    prompt = torch.randint(0, V, (2, 5), generator=torch.Generator().manual_seed(7))
    a = generate(again, prompt, 10, temperature=0, use_cache=True)
    assert torch.equal(a, generate(model, prompt, 10, temperature=0, use_cache=False))


def test_cache_refuses_tol():
    model = tiny("rpc-first", dropout=0.0).eval()
    model.blocks[0].attn.tol = 0.01
    with pytest.raises(ValueError, match="cannot apply tol"):
        generate(model, torch.zeros(1, 3, dtype=torch.long), 2, use_cache=True)


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
