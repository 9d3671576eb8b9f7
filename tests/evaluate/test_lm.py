"""LM evaluation: window protocols, sliding-window perplexity against a float64 reference, suites, and
an end-to-end run (train -> lower validation perplexity -> eval suites -> generate)."""

import json
import math

import numpy as np
import pytest
import torch
from corpora import random_wikitext, wikitext_settings

from rpc_attention.evaluate.lm import nll_blocks, plain_windows, score_stream, sliding_windows, target_nll
from rpc_attention.evaluate.per_example import example_data
from rpc_attention.models.lm import build_lm

V = 40


def test_sliding_windows_cover_every_target_once_with_the_stated_context():
    for n, ctx, stride in [(50, 8, 1), (50, 8, 3), (50, 8, 8), (9, 8, 2), (8, 8, 4), (2, 8, 1), (100, 16, 5)]:
        ctx_of = {}
        for b, e, k in sliding_windows(n, ctx, stride):
            assert 0 <= b < e <= n - 1 and e - b <= ctx and 1 <= k <= e - b
            for t in range(e - k + 1, e + 1):
                assert t not in ctx_of
                ctx_of[t] = b
        assert sorted(ctx_of) == list(range(1, n))
        for t, b in ctx_of.items():  # target t sees x[b:t], b = max(0, ceil((t - ctx) / stride)) * stride
            assert b == max(0, math.ceil((t - ctx) / stride)) * stride
            assert t - b >= min(t, ctx - stride + 1)
        covered = [t for b, e, k in plain_windows(n, ctx) for t in range(b + 1, e + 1)]
        assert covered == list(range(1, n))
    with pytest.raises(ValueError):
        sliding_windows(20, 4, 5)


def _reference_nll(model, tokens, ctx, stride=None, per_target=False):
    """float64 loop: each target scored on its own with its protocol context (the sum, or the list)."""
    m = model.double()
    total = 0.0
    each = []
    with torch.no_grad():
        for t in range(1, len(tokens)):
            if stride is None:  # plain
                b = ((t - 1) // ctx) * ctx
            else:
                b = max(0, math.ceil((t - ctx) / stride)) * stride
            inp = torch.tensor(tokens[b:t], dtype=torch.long)[None]
            logp = m.next_logprob(inp)[0]
            assert logp.dtype == torch.float64
            total -= float(logp[int(tokens[t])])
            each.append(-float(logp[int(tokens[t])]))
    model.float()
    return each if per_target else total


@pytest.mark.parametrize("variant", [dict(), dict(rpc_layers=[0], n_iter=3)])
def test_sliding_window_perplexity_equals_direct_float64_computation(variant):
    torch.manual_seed(0)
    model = build_lm(None, vocab_size=V, n_layer=2, d_model=16, n_head=2, d_inner=32, context=8, dropout=0.0,
                     cutoffs=[10, 25], **variant).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    tokens = np.random.default_rng(0).integers(0, V, size=26).astype(np.int32)
    for stride in (1, 3):
        nll, n = score_stream(model, tokens, "sliding", stride=stride, batch_size=5)
        assert n == 25
        ref = _reference_nll(model, tokens, 8, stride)
        # float32 log-softmax and a mean over 25 tokens vs a float64 reference: ~100 eps relative
        assert nll == pytest.approx(ref, rel=128 * torch.finfo(torch.float32).eps)
        # the float64 model through the same code agrees to float64 precision
        nll64, _ = score_stream(model.double(), tokens, "sliding", stride=stride, batch_size=4)
        model.float()
        assert nll64 == pytest.approx(ref, rel=1e-10)
    nll, n = score_stream(model, tokens, "plain", batch_size=3)
    assert n == 25 and nll == pytest.approx(_reference_nll(model, tokens, 8), rel=128 * torch.finfo(torch.float32).eps)
    # the protocols really differ (plain restarts the context every 8 tokens)
    assert score_stream(model, tokens, "sliding", stride=1)[0] != pytest.approx(nll, rel=1e-9)
    # every target's own NLL (the per-example record of a perplexity), float64 model against the loop
    each = target_nll(model.double(), tokens, "sliding", stride=3, batch_size=4)
    model.float()
    np.testing.assert_allclose(each, _reference_nll(model, tokens, 8, 3, per_target=True), rtol=1e-10, atol=0)
    blocks = nll_blocks(each, 8)
    assert [b[1] for b in blocks] == [8, 8, 8, 1] and sum(b[0] for b in blocks) == pytest.approx(each.sum(), rel=1e-14)


def test_suites_are_registered_for_lm():
    from rpc_attention.evaluate.suites import get_suite, list_suites

    assert {"ppl", "wordswap"} <= set(list_suites("lm"))
    assert get_suite("wordswap").defaults["rate"] == 0.015 and get_suite("wordswap").defaults["token"] == "AAA"


# ------------------------------------------------------------------------------------ end to end

NOUNS = ["cat", "dog", "bird", "fish", "horse", "king", "queen", "city"]
VERBS = ["sees", "likes", "eats", "finds"]
ADJS = ["big", "small", "red", "old"]


def _sentence(rng):
    return f"the {rng.choice(ADJS)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} ."


def _line(rng):
    return " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))


@pytest.mark.xdist_group("lm_e2e")
def test_training_lowers_validation_perplexity_then_eval_and_generate(tmp_path, capsys):
    from rpc_attention.cli import main
    from rpc_attention.train import load_run, resolve_config, run_training

    root = random_wikitext(tmp_path / "wt", _line, (("train", 600), ("valid", 60), ("test", 60)))
    cfg = resolve_config("wiki-rpc-symlm", [
        *wikitext_settings(root, tmp_path / "cache"),
        "model.kwargs.n_layer=2", "model.kwargs.d_model=32", "model.kwargs.n_head=4", "model.kwargs.d_inner=64",
        "model.kwargs.context=16", "model.kwargs.rpc_layers=[0]", "model.kwargs.n_iter=2",
        "model.kwargs.cutoffs=[8]", "model.kwargs.init_std=0.1", "train.max_steps=60", "train.batch_size=16", "schedule.warmup_steps=5",
        "optim.lr=0.01", "train.log_every=20", "train.save_every=0", "train.eval_every=1", "eval.batch_size=64",
    ])
    assert cfg["model"]["kwargs"]["vocab_size"] == 1 + 1 + len(set(NOUNS + VERBS + ADJS + ["the", "."]))
    assert cfg["train"]["max_steps"] == 60
    run = run_training(cfg, tmp_path / "run")
    records = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r["ppl"] for r in records if r.get("split") == "val"]
    train = [r for r in records if r.get("split") == "train"]
    assert train and "tokens_per_s" in train[0]
    assert len(val) >= 2 and val[-1] < val[0]
    assert val[-1] < 6.0  # unigram perplexity of this language is ~13, uniform 20

    model, cfg2 = load_run(run)
    assert model.config.rpc_layers == [0] and not model.training

    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--suite", "ppl,wordswap", "--set", "stride=4",
                 "--set", "wordswap.rate=0.2"]) == 0
    ppl = json.loads((run / "eval" / "ppl.json").read_text())
    ws = json.loads((run / "eval" / "wordswap.json").read_text())
    for key in ("valid_ppl_sliding", "valid_ppl_plain", "test_ppl_sliding", "test_ppl_plain"):
        assert 1.0 < ppl["metrics"][key] < 20.0
    assert ws["metrics"]["test_attacked_ppl_sliding"] > ws["metrics"]["test_ppl_sliding"]
    assert ws["metrics"]["test_ppl_sliding"] == pytest.approx(ppl["metrics"]["test_ppl_sliding"])
    # the per-block records reproduce every perplexity (exp of NLL sum over token count)
    for rec in (ppl, ws):
        for key, value in rec["metrics"].items():
            if "_ppl_" in key:
                data = example_data(rec["per_example"], key)
                assert data.statistic(data.values, None) == pytest.approx(value, rel=1e-12), key
    assert ws["data"]["token_in_vocab"] is False  # AAA -> <unk>
    assert (run / "eval" / "ppl.md").read_text().count("sliding") >= 2

    capsys.readouterr()
    assert main(["generate", "--run", str(run), "--prompt", "the big cat", "--max-new-tokens", "12",
                 "--temperature", "0", "--tokens"]) == 0
    out_cache = capsys.readouterr().out
    assert main(["generate", "--run", str(run), "--prompt", "the big cat", "--max-new-tokens", "12",
                 "--temperature", "0", "--tokens", "--no-cache"]) == 0
    out_plain = capsys.readouterr().out
    assert out_cache == out_plain
    words = out_cache.split("||")[1].split()
    assert len(words) == 12 and set(words) <= set(NOUNS + VERBS + ADJS + ["the", ".", "<eos>", "<unk>"])
    # bad input: a classification-style error, no traceback
    assert main(["generate", "--run", str(tmp_path / "nope"), "--prompt", "x"]) == 2
