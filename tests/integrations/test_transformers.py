"""Hugging Face integration: attn_implementation="rpc" on tiny models built from configs (no hub)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rpc_attention.functional as RF  # noqa: E402
import rpc_attention.integrations.transformers as rpc_hf  # noqa: E402
from rpc_attention.integrations import _core  # noqa: E402

INF = float("inf")


@pytest.fixture(autouse=True)
def _registered():
    torch.manual_seed(0)
    rpc_hf.register()
    yield
    rpc_hf.unregister()


def llama(**kw):
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=kw.pop("kv_heads", 2), vocab_size=64,
                                   max_position_embeddings=64, **kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc").eval()


def gpt2(**kw):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64, **kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc").eval()


def mistral(**kw):
    """GQA (4 query heads, 2 k/v heads); ``sliding_window=None`` unless given."""
    kw.setdefault("sliding_window", None)
    cfg = transformers.MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=64, max_position_embeddings=64, **kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc").eval()


def qwen2(**kw):
    """MQA (4 query heads, one k/v head)."""
    cfg = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=1, vocab_size=64, max_position_embeddings=64, **kw)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc").eval()


def bert(**kw):
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=64, **kw)
    return transformers.AutoModel.from_config(cfg, attn_implementation="rpc").eval()


def vit(**kw):
    cfg = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                 image_size=16, patch_size=4, num_channels=3, num_labels=3, **kw)
    return transformers.AutoModelForImageClassification.from_config(cfg, attn_implementation="rpc").eval()


def out_of(model, *args, **kw):
    out = model(*args, **kw)
    return out.logits if hasattr(out, "logits") and out.logits is not None else out.last_hidden_state


def with_impl(model, impl, *args, **kw):
    model.set_attn_implementation(impl)
    try:
        return out_of(model, *args, **kw)
    finally:
        model.set_attn_implementation("rpc")


def padded_batch(side):
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.long)
    if side == "left":
        mask[0, :3] = 0
    else:
        mask[0, -3:] = 0
    return ids, mask


def valid_rows(a, b, mask):
    keep = mask.bool()
    return (a[keep] - b[keep]).abs().max().item()


def test_registered_in_both_interfaces():
    from transformers import AttentionInterface, AttentionMaskInterface

    assert rpc_hf.is_registered()
    assert AttentionInterface._global_mapping["rpc"] is rpc_hf.rpc_attention_forward
    assert AttentionMaskInterface._global_mapping["rpc"] is rpc_hf.rpc_mask
    rpc_hf.unregister()
    assert not rpc_hf.is_registered()


@pytest.mark.parametrize("build", [llama, gpt2])
def test_causal_model_receives_causal_and_padding_mask(build, monkeypatch):
    seen = []
    orig = rpc_hf.rpc_attention_forward

    def spy(module, q, k, v, attention_mask, **kw):
        seen.append(attention_mask)
        return orig(module, q, k, v, attention_mask, **kw)

    monkeypatch.setitem(transformers.AttentionInterface._global_mapping, "rpc", spy)
    model = build()
    ids, am = padded_batch("left")
    model(ids)  # no padding: still an explicit causal mask
    model(ids, attention_mask=am)
    assert seen and all(m is not None for m in seen)
    nopad, pad = seen[0], seen[-1]
    assert nopad.dtype == torch.bool and nopad.shape[-2:] == (9, 9)
    assert torch.equal(nopad[0, 0], torch.ones(9, 9, dtype=torch.bool).tril())
    assert not pad[0, 0, :, :3].any() and pad[1, 0, -1].all()


@pytest.mark.parametrize("build", [llama, gpt2, bert])
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_large_lambda_equals_model_attention(build, impl, side):
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=INF)
    model = build()
    ids, am = padded_batch(side)
    ref = with_impl(model, impl, ids, attention_mask=am)
    got = out_of(model, ids, attention_mask=am)
    assert valid_rows(got, ref, am) < 1e-5
    # and RPC with a finite lambda does change the output
    rpc_hf.configure(model, lambd=0.5, threshold="lambda_over_mu")
    assert valid_rows(out_of(model, ids, attention_mask=am), ref, am) > 1e-4


def test_vit_rpc_and_layers_without_layer_idx():
    model = vit()  # default rpc_layers=[0]: ViT attention has no layer_idx, numbered at creation
    x = torch.randn(2, 3, 16, 16)
    rpc_hf.configure(model, rpc_layers=[1], lambd=0.5, threshold="lambda_over_mu")
    idx = [m.rpc_layer_idx for m in model.modules() if hasattr(m, "rpc_layer_idx")]
    assert idx == [0, 1]
    ref = with_impl(model, "sdpa", pixel_values=x, output_hidden_states=True)
    out = model(pixel_values=x, output_hidden_states=True)
    model.set_attn_implementation("sdpa")
    ref_h = model(pixel_values=x, output_hidden_states=True).hidden_states
    torch.testing.assert_close(out.hidden_states[1], ref_h[1], rtol=0, atol=1e-6)  # block 0: plain
    assert (out.logits - ref).abs().max() > 1e-5  # block 1: RPC
    model.config.rpc_lambd = INF
    model.set_attn_implementation("rpc")
    torch.testing.assert_close(out_of(model, pixel_values=x), ref, rtol=0, atol=1e-5)
    for m in model.modules():  # a module that lost its number is never silently plain
        if hasattr(m, "rpc_layer_idx"):
            del m.rpc_layer_idx
    with pytest.raises(ValueError, match="no layer_idx"):
        model(pixel_values=x)


def test_layer_selection_by_config_keyword():
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=64, rpc_layers=[1], rpc_lambd=0.5,
                                   rpc_threshold="lambda_over_mu", rpc_n_iter=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc").eval()
    ids = torch.randint(0, 64, (1, 8))
    out = model(ids, output_hidden_states=True).hidden_states
    model.set_attn_implementation("sdpa")
    ref = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-6)
    assert (out[2] - ref[2]).abs().max() > 1e-5


def test_gqa_matches_repeated_heads():
    """PAP on grouped k/v heads == the same model with k/v projections duplicated per query head."""
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=0.5, threshold="lambda_over_mu")
    model = llama(kv_heads=2)
    full = llama(kv_heads=4)
    sd = model.state_dict()
    for name, t in sd.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            t = t.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
        full.state_dict()[name].copy_(t)
    ids, am = padded_batch("left")
    torch.testing.assert_close(out_of(model, ids, attention_mask=am), out_of(full, ids, attention_mask=am),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("clean_queries", [True, False])
@pytest.mark.parametrize("build", [llama, gpt2])
def test_causal_leak(build, clean_queries):
    rpc_hf.register(rpc_layers="all", n_iter=4, lambd=0.5, threshold="lambda_over_mu", clean_queries=clean_queries)
    model = build()
    ids, am = padded_batch("left")
    ids2 = ids.clone()
    ids2[:, 6:] = (ids2[:, 6:] + 7) % 64
    a = out_of(model, ids, attention_mask=am)
    b = out_of(model, ids2, attention_mask=am)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.equal(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("clean_queries", [True, False])
def test_kv_cache_decoding_matches_full_forward(clean_queries):
    """With a cache, queries are shorter than keys: PAP runs over all cached keys (causal) and the
    queries are cleaned with the rows of S at their positions, so prefill, single-token and chunked
    steps equal the full forward."""
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=0.5, threshold="lambda_over_mu", clean_queries=clean_queries)
    model = llama()
    ids, am = padded_batch("left")
    full = out_of(model, ids, attention_mask=am)
    pre = model(ids[:, :6], attention_mask=am[:, :6], use_cache=True)
    step = model(ids[:, 6:7], attention_mask=am[:, :7], cache=pre.cache, use_cache=True)
    chunk = model(ids[:, 7:], attention_mask=am, cache=step.cache, use_cache=True)
    torch.testing.assert_close(pre.logits, full[:, :6], rtol=0, atol=1e-5)
    torch.testing.assert_close(step.logits[:, 0], full[:, 6], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunk.logits, full[:, 7:], rtol=0, atol=1e-5)
    gen = model.generate(ids, attention_mask=am, max_new_tokens=3, do_sample=False)
    assert gen.shape == (2, 12)


def test_queries_cleaned_only_for_same_tokens():
    q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
    k = k.clone()
    k[..., 2, 1] = 30.0  # a sparse outlier for PAP to remove
    opts = dict(n_iter=3, lambd=0.3, threshold="lambda_over_mu")
    out, st = _core.asymmetric_rpc_attention(q, k, v, return_state=True, **opts)
    assert st.sparse.abs().sum() > 0
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q - st.sparse, k - st.sparse, v))
    out_x = _core.asymmetric_rpc_attention(q, k, v, same_tokens=False, **opts)
    torch.testing.assert_close(out_x, torch.nn.functional.scaled_dot_product_attention(q, k - st.sparse, v))
    # causal with a cache (2 queries, 6 keys): the queries are the last two tokens, cleaned with S's last rows
    out_c = _core.asymmetric_rpc_attention(q[:, :, -2:], k, v, is_causal=True, **opts)
    full, stc = _core.asymmetric_rpc_attention(q, k, v, is_causal=True, return_state=True, **opts)
    ks = k - stc.sparse
    ref = torch.nn.functional.scaled_dot_product_attention(q[:, :, -2:] - stc.sparse[:, :, -2:], ks, v,
                                                           attn_mask=torch.ones(2, 6, dtype=torch.bool).tril(4))
    torch.testing.assert_close(out_c, ref)
    torch.testing.assert_close(out_c, full[:, :, -2:])
    out_nc = _core.asymmetric_rpc_attention(q[:, :, -2:], k, v, is_causal=True, clean_queries=False, **opts)
    ref_nc = torch.nn.functional.scaled_dot_product_attention(q[:, :, -2:], ks, v,
                                                              attn_mask=torch.ones(2, 6, dtype=torch.bool).tril(4))
    torch.testing.assert_close(out_nc, ref_nc)


def test_bad_options_raise():
    with pytest.raises(ValueError, match="lambd"):
        rpc_hf.register(lambd=-1)
    with pytest.raises(ValueError, match="rpc_layers"):
        rpc_hf.register(rpc_layers="first")
    with pytest.raises(ValueError, match="unknown"):
        rpc_hf.register(nonsense=1)
    model = llama()
    model.config.rpc_key_mode = "bogus"
    with pytest.raises(ValueError, match="key_mode"):
        model(torch.randint(0, 64, (1, 4)))


def test_cross_attention_never_cleans_queries(monkeypatch):
    calls = []
    orig = rpc_hf.asymmetric_rpc_attention

    def spy(q, k, v, **kw):
        calls.append((q.shape[2], k.shape[2], kw["same_tokens"], kw["is_causal"]))
        return orig(q, k, v, **kw)

    monkeypatch.setattr(rpc_hf, "asymmetric_rpc_attention", spy)
    rpc_hf.register(rpc_layers="all", n_iter=2, lambd=INF)
    model = gpt2(add_cross_attention=True)
    ids = torch.randint(0, 64, (2, 6))
    enc = torch.randn(2, 6, 32)  # same length as the decoder input: still cross-attention
    # without a cache: with one, causal self-attention goes through the cached path instead
    got = out_of(model, ids, encoder_hidden_states=enc, use_cache=False)
    assert sorted(set(calls)) == [(6, 6, False, False), (6, 6, True, True)]
    monkeypatch.setattr(rpc_hf, "asymmetric_rpc_attention", orig)
    torch.testing.assert_close(got, with_impl(model, "eager", ids, encoder_hidden_states=enc), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# KV cache: cached decoding (queries cleaned with the last rows of S) == uncached decoding
# ---------------------------------------------------------------------------------------------

def prompts(batched):
    ids = torch.randint(0, 64, (2 if batched else 1, 7))
    mask = torch.ones_like(ids)
    if batched:
        mask[0, :3] = 0  # left padding
    return ids, mask


def greedy(model, ids, mask, **kw):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, min_new_tokens=6,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences, torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("build", [llama, gpt2, mistral, qwen2])
def test_cached_greedy_generation_equals_uncached(build, batched, cache):
    # lambda/mu with a small lambda: S is far from 0, so uncleaned decoding queries change the tokens
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=0.5, threshold="lambda_over_mu")
    model = build(initializer_range=0.3).double()  # weights large enough for clearly separated logits
    ids, mask = prompts(batched)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    seq, logits = greedy(model, ids, mask, **extra)
    seq_full, logits_full = greedy(model, ids, mask, use_cache=False)
    assert torch.equal(seq, seq_full)
    # float64: both runs do the same arithmetic up to reduction order over (at most) 13 keys and
    # 32 features, so they agree to a few thousand ulps of the O(1) logits
    torch.testing.assert_close(logits, logits_full, rtol=0, atol=1e-11)
    model.set_attn_implementation("sdpa")
    _, logits_sdpa = greedy(model, ids, mask, use_cache=False)
    assert (logits_sdpa - logits_full).abs().max() > 1e-3  # RPC did change the model


def test_sliding_window_layers_are_refused():
    """A sliding-window cache drops the keys PAP needs, so cached decoding could not equal the full
    forward: RPC refuses such layers when the model is created, and at the forward if a window is
    set later. Layers left out of rpc_layers keep their window."""
    rpc_hf.register(rpc_layers="all")
    with pytest.raises(ValueError, match="sliding_window"):
        mistral(sliding_window=4)
    # Qwen2 with layer 0 full and layer 1 sliding
    with pytest.raises(ValueError, match=r"sliding_window.*layer 1|layer 1.*sliding_window"):
        qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=1)
    rpc_hf.register(rpc_layers=[0], n_iter=3, lambd=0.5, threshold="lambda_over_mu")
    model = qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=1, initializer_range=0.3).double()
    ids, mask = prompts(True)
    seq, logits = greedy(model, ids, mask)
    seq_full, logits_full = greedy(model, ids, mask, use_cache=False)
    assert torch.equal(seq, seq_full)
    torch.testing.assert_close(logits, logits_full, rtol=0, atol=1e-11)  # float64, as above
    late = mistral()
    late.config.sliding_window = 4
    with pytest.raises(ValueError, match="sliding_window"):
        late(ids)


@pytest.mark.parametrize("build", [llama, gpt2])
def test_infinite_lambda_gives_the_gradients_of_sdpa(build):
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=INF)
    model = build().double()
    ids, am = padded_batch("left")

    def grads():
        model.zero_grad()
        model(ids, attention_mask=am, labels=ids).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    got = grads()
    model.set_attn_implementation("sdpa")
    ref = grads()
    assert got.keys() == ref.keys() and len(got) > 10
    for name in ref:
        assert torch.isfinite(got[name]).all(), name
        # float64; same arithmetic as sdpa except PAP's (exactly zero) S and the mask path
        torch.testing.assert_close(got[name], ref[name], rtol=1e-9, atol=1e-12, msg=name)


# ---------------------------------------------------------------------------------------------
# Settings: written into the config at creation, checked at creation, kept by save/load
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw, match", [
    (dict(rpc_layers=[7]), r"rpc_layers=\[7\].*layers are \[0, 1\]"),
    (dict(rpc_n_iters=2), "unknown.*rpc_n_iters.*did you mean 'rpc_n_iter'"),
    (dict(rpc_lamda=2.0), "unknown.*rpc_lamda.*did you mean 'rpc_lambd'"),
    (dict(rpc_lambd=-1), "lambd must be >= 0"),
    (dict(rpc_n_iter=0), "n_iter must be >= 1"),
    (dict(rpc_mu_mode="global"), "mu_mode='global' with is_causal=True"),
    (dict(rpc_tol=1e-3), "rpc_tol is set but .* is causal"),
])
def test_bad_config_raises_when_the_model_is_created(kw, match):
    with pytest.raises(ValueError, match=match):
        llama(**kw)
    model = llama()
    model.set_attn_implementation("sdpa")
    for key, value in kw.items():
        setattr(model.config, key, value)
    with pytest.raises(ValueError, match=match):
        model.set_attn_implementation("rpc")


def test_bad_options_raise_when_registered_or_configured():
    rpc_hf.register(rpc_layers=[7])
    with pytest.raises(ValueError, match=r"rpc_layers=\[7\]"):
        gpt2()
    rpc_hf.register(rpc_layers=[0])
    model = gpt2()
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match=r"rpc_layers=\[5\]"):
        rpc_hf.configure(model, rpc_layers=[5], n_iter=2)
    assert (model.config.rpc_layers, model.config.rpc_n_iter) == ([0], 6)  # unchanged by the failed call
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="unknown"):
        rpc_hf.configure(model, n_iters=2)
    with pytest.raises(ValueError, match="mu_mode"):
        rpc_hf.configure(model, mu_mode="global")
    bert(rpc_mu_mode="global", rpc_tol=1e-3)  # bidirectional: the global mu is the official one, tol is fine
    model = llama()
    model.config.rpc_tol = 1e-3  # set behind prepare()'s back: the forward refuses it
    with pytest.raises(ValueError, match="rpc_tol"):
        model(torch.randint(0, 64, (1, 4)))


def test_register_options_are_written_into_the_config_and_survive_save_load(tmp_path):
    rpc_hf.register(rpc_layers=[1], n_iter=2, lambd=0.5, threshold="lambda_over_mu")
    model = llama()
    ids, am = padded_batch("left")
    out = out_of(model, ids, attention_mask=am)
    rpc_hf.register(rpc_layers="all", n_iter=4, lambd=2.0)  # later defaults do not change this model
    assert torch.equal(out_of(model, ids, attention_mask=am), out)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {k: saved[k] for k in ("rpc_layers", "rpc_n_iter", "rpc_lambd", "rpc_threshold")} == {
        "rpc_layers": [1], "rpc_n_iter": 2, "rpc_lambd": 0.5, "rpc_threshold": "lambda_over_mu"}
    rpc_hf.unregister()
    rpc_hf.register()  # a new process with the default options
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="rpc").eval()
    assert torch.equal(out_of(again, ids, attention_mask=am), out)
    fresh = llama()  # the same weights under this process's defaults: the saved options mattered
    fresh.load_state_dict(model.state_dict())
    assert (out_of(fresh, ids, attention_mask=am) - out).abs().max() > 1e-4


def test_infinite_lambda_survives_save_load(tmp_path):
    rpc_hf.register(lambd=INF)
    gpt2().save_pretrained(tmp_path)
    rpc_hf.register(lambd=1.0)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="rpc")
    assert again.config.rpc_lambd == INF


def test_vit_layer_list_works_at_creation_and_after_reload(tmp_path):
    rpc_hf.register(rpc_layers=[1], lambd=0.5, threshold="lambda_over_mu")
    model = vit()  # attention modules without layer_idx are numbered when the model is created
    assert [m.rpc_layer_idx for m in model.modules() if hasattr(m, "rpc_layer_idx")] == [0, 1]
    x = torch.randn(2, 3, 16, 16)
    out = out_of(model, pixel_values=x)
    assert (out - with_impl(model, "sdpa", pixel_values=x)).abs().max() > 1e-5
    model.save_pretrained(tmp_path)
    rpc_hf.unregister()
    rpc_hf.register()
    again = transformers.AutoModelForImageClassification.from_pretrained(tmp_path, attn_implementation="rpc").eval()
    assert torch.equal(out_of(again, pixel_values=x), out)
    with pytest.raises(ValueError, match=r"rpc_layers=\[2\].*layers are \[0, 1\]"):
        rpc_hf.configure(again, rpc_layers=[2])


# ---------------------------------------------------------------------------------------------
# Cached decoding with the per-pass PAP state (functional.PAPCache beside the model's cache)
# ---------------------------------------------------------------------------------------------

def _stepwise_logits(model, ids, mask, prompt):
    """Logits of a prefill of ``prompt`` tokens, then one token at a time over the model's cache."""
    out = model(ids[:, :prompt], attention_mask=mask[:, :prompt], use_cache=True)
    logits, cache = [out.logits], out.cache
    for i in range(prompt, ids.shape[1]):
        out = model(ids[:, i:i + 1], attention_mask=mask[:, :i + 1], cache=cache, use_cache=True)
        logits.append(out.logits)
        cache = out.cache
    return torch.cat(logits, dim=1), cache


PAP_CASES = [
    *[dict(rpc_layers="all", n_iter=n, lambd=0.5, threshold="lambda_over_mu") for n in range(1, 7)],
    dict(rpc_layers=[1], n_iter=4, lambd=4.0, threshold="lambda_mu", mu_mode="causal_head_dim"),
    dict(rpc_layers="all", n_iter=3, lambd=1.0, threshold="candes", mu_mode="causal", key_mode="pap"),
    dict(rpc_layers=[0], n_iter=2, lambd=INF, clean_queries=False),
]


@pytest.mark.parametrize("opts", PAP_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_pap_state_decoding_equals_the_full_forward_in_float64(opts):
    # float64: the cached passes differ from the full forward by rounding only (reduction order);
    # 1e-10 on O(1) logits is far above that and far below any real discrepancy
    rpc_hf.register(**opts)
    model = llama(initializer_range=0.3).double()
    ids, mask = padded_batch("left")
    full = model(ids, attention_mask=mask).logits
    got, _ = _stepwise_logits(model, ids, mask, prompt=5)
    rows = mask.bool()
    torch.testing.assert_close(got[rows], full[rows], rtol=0, atol=1e-10)
    n_layers = 2 if opts["rpc_layers"] == "all" else 1
    b, t, h, d = ids.shape[0], 5, 4, 8
    # after the prefill, per RPC layer: n_iter - 1 cleaned-key tensors, the output keys, two running
    # sums and the key mask (the prompt is padded)
    cache = model(ids[:, :t], attention_mask=mask[:, :t], use_cache=True).cache
    expected = n_layers * (opts["n_iter"] * b * h * t * d * 8 + 2 * b * h * 8 + b * t)
    assert rpc_hf.decoding_cache_bytes(cache) == expected


@pytest.mark.parametrize("build", [llama, gpt2, mistral, qwen2])
def test_beam_search_with_the_pap_state_equals_uncached_beam_search(build):
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=0.5, threshold="lambda_over_mu")
    model = build(initializer_range=0.3).double()
    ids, mask = prompts(True)
    kw = dict(attention_mask=mask, max_new_tokens=6, min_new_tokens=6, num_beams=3, num_return_sequences=3,
              do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    cached, uncached = model.generate(ids, **kw), model.generate(ids, use_cache=False, **kw)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=0, atol=1e-10)


def test_beam_reorder_is_followed_not_recomputed():
    """After the model's cache is reordered, the PAP state is reordered with it (found by checksum and
    exact comparison), so the next step equals the full forward of the reordered sequences."""
    rpc_hf.register(rpc_layers="all", n_iter=3, lambd=0.5, threshold="lambda_over_mu")
    model = llama(initializer_range=0.3).double()
    ids = torch.randint(0, 64, (3, 8))
    mask = torch.ones_like(ids)
    out = model(ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
    index = torch.tensor([2, 2, 0])
    out.cache.reorder_cache(index)
    before = rpc_hf.decoding_cache_bytes(out.cache)
    ids2 = ids.index_select(0, index)
    ids2[1, 6:] = ids[1, 6:]
    step = model(ids2[:, 6:7], attention_mask=mask[:, :7], cache=out.cache, use_cache=True)
    torch.testing.assert_close(step.logits[:, 0], model(ids2[:, :7]).logits[:, -1], rtol=0, atol=1e-10)
    assert rpc_hf.decoding_cache_bytes(step.cache) > before
    assert not rpc_hf._reordered(torch.zeros(3, 4, 6, 8), torch.ones(3, 4, 6, 8), _pap_state(3, 6))


def _pap_state(b, t):
    k = torch.randn(b, 4, t, 8)
    _, state, pap = RF.pap_prefill(k, k, n_iter=2, final_attention=False)
    return _core.AsymmetricRPCCache(pap, k)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_generation_after_save_and_reload(tmp_path, cache):
    rpc_hf.register(rpc_layers="all", n_iter=4, lambd=0.5, threshold="lambda_over_mu")
    model = llama(initializer_range=0.3).double()
    model.save_pretrained(tmp_path)
    rpc_hf.unregister()
    rpc_hf.register()  # other defaults in the new "process": the saved config wins
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="rpc").double().eval()
    ids, mask = prompts(True)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    seq, _ = greedy(again, ids, mask, **extra)
    seq_full, _ = greedy(model, ids, mask, use_cache=False)
    assert torch.equal(seq, seq_full)
