"""The ``kpca`` evaluation suite: its numbers against a float64 reference written from the definitions,
the rebuilt initialisation against the trainer's step-0 weights, its errors and its determinism."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from rpc_attention.cli import main
from rpc_attention.evaluate import suites as S
from rpc_attention.evaluate.inputs import load_eval_data
from rpc_attention.kpca import register_suites
from rpc_attention.kpca import suite as K

FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
needs_fmnist = pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")
MEAN, STD = 0.2860, 0.3530


def _cfg(name="symvit_tiny_patch16_224", patch=14, dim=8, heads=2, seed=3, **train):
    """A tiny Fashion-MNIST classifier: 28 / 14 = 2 x 2 patches and a class token, N = 5 tokens, Dv = dim / heads."""
    return {
        "task": "classification",
        "model": {"name": name, "kwargs": {"num_classes": 10, "img_size": 28, "in_chans": 1, "patch_size": patch,
                                           "embed_dim": dim, "depth": 2, "num_heads": heads, "drop_path_rate": 0.0}},
        "data": {"name": "fashion_mnist", "mean": [MEAN], "std": [STD], "num_classes": 10, "in_chans": 1,
                 "img_size": 28},
        "train": {"seed": seed, **train},
    }


def _trained_like(cfg, noise=0.3):
    """The initial model of ``cfg`` moved away from its initialisation by seeded noise (a stand-in for training)."""
    model = K.init_model(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn(p.shape, generator=gen))
    return model.eval()


def _run(model, cfg, limit=4, **sets):
    register_suites()
    suite = S.get_suite("kpca")
    opts = S.resolve_options(suite, {f"kpca.{k}": v for k, v in sets.items()}, limit=limit)
    suite.check(cfg, opts)
    return S.run_suite(suite, model, cfg, None, opts)


# ------------------------------------------------------------------------ the float64 reference

def _attention_inputs(model, x):
    """The input of every attention module (the SymViT family's ``attn``) of one forward pass."""
    from rpc_attention import nn as rnn

    seen = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append((mod, args[0].detach())))
             for m in model.modules() if isinstance(m, rnn.SymmetricAttention)]
    with torch.no_grad():
        model((x - MEAN) / STD)
    for h in hooks:
        h.remove()
    return seen


def _std_tokens(x):
    return (x - x.mean(-1, keepdims=True)) / x.std(-1, ddof=1, keepdims=True)


def _jproj(k, v, s):
    """(1/N) sum_i exp(s k_i.k_i) / g(k_i)^2 - ||h_i||^2 with q = k (symmetric attention), by loops."""
    n = len(k)
    total = 0.0
    for i in range(n):
        e = np.array([np.exp(s * np.dot(k[i], k[j])) for j in range(n)])
        g = e.sum()
        h = sum(e[j] / g * v[j] for j in range(n))
        total += np.exp(s * np.dot(k[i], k[i])) / g ** 2 - np.dot(h, h)
    return total / n


def _vhat(k, dv, s):
    """V_hat = G (A - 1_N A) from the top-dv eigenvectors A of K_c = H K_phi H, K_phi[i,j] = k(k_i,k_j)/(g_i g_j)."""
    n = len(k)
    kern = np.array([[np.exp(s * np.dot(k[i], k[j])) for j in range(n)] for i in range(n)])
    g = kern.sum(1)
    k_phi = kern / np.outer(g, g)
    h = np.eye(n) - np.full((n, n), 1.0 / n)
    k_c = h @ k_phi @ h
    # torch's eigh, as the analysis: the eigenvector signs are LAPACK's (optimal cosine depends on them)
    evals, evecs = torch.linalg.eigh(torch.from_numpy(0.5 * (k_c + k_c.T)))
    a = evecs.numpy()[:, np.argsort(-evals.numpy())[:dv]]
    return (a - a.mean(0, keepdims=True)) / g[:, None]


def _optimal_cosine(x, y):
    """Brute force over every one-to-one matching of rows."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    yn = y / np.linalg.norm(y, axis=1, keepdims=True)
    c = xn @ yn.T
    return max(np.mean([c[i, p[i]] for i in range(len(x))]) for p in itertools.permutations(range(len(x))))


def _linear_cka(x, y):
    xc, yc = x - x.mean(0), y - y.mean(0)
    return np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))


def _reference(model, x, protocol, alignment=True):
    """Model-level mean over (layer, head, example) records of J_proj, optimal cosine and linear CKA."""
    rec = {"jproj": [], "optimal_cosine": [], "linear_cka": []}
    for mod, inp in _attention_inputs(model, x):
        w, b = mod.qkv.weight.detach().double().numpy(), mod.qkv.bias.detach().double().numpy()
        heads, hd = mod.num_heads, mod.head_dim
        s = hd ** -0.5
        for ex in range(len(x)):
            kv = inp[ex].double().numpy() @ w.T + b  # (N, 2 * heads * hd): keys, then values
            for hh in range(heads):
                k = kv[:, hh * hd:(hh + 1) * hd]
                v = kv[:, (heads + hh) * hd:(heads + hh + 1) * hd]
                if protocol == "paper":
                    k = _std_tokens(k)
                rec["jproj"].append(_jproj(k, v, s))
                if alignment:
                    vh = _vhat(k, v.shape[1], s)
                    rec["optimal_cosine"].append(_optimal_cosine(v, vh))
                    rec["linear_cka"].append(_linear_cka(v, vh))
    return {key: float(np.mean(vals)) for key, vals in rec.items() if vals}


def _chance_reference(n, d, draws, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(draws, n, d, generator=gen, dtype=torch.float64).numpy()
    y = torch.randn(draws, n, d, generator=gen, dtype=torch.float64).numpy()
    return {"optimal_cosine": np.mean([_optimal_cosine(x[i], y[i]) for i in range(draws)]),
            "linear_cka": np.mean([_linear_cka(x[i], y[i]) for i in range(draws)])}


@needs_fmnist
def test_metrics_equal_a_float64_reference_of_the_definitions():
    cfg = _cfg()
    model = _trained_like(cfg)
    rec = _run(model, cfg, limit=3, seed=5, chance_draws=3)
    assert set(rec["metrics"]) == set(K.METRICS) == set(S.get_suite("kpca").metrics)
    x, _ = load_eval_data(cfg, "test", 3)
    chance = _chance_reference(5, 4, draws=3, seed=5)  # N = 5 tokens, Dv = 8 / 2
    for proto in ("paper", "exact"):
        ref = _reference(model, x, proto)
        ref_init = _reference(K.init_model(cfg), x, proto, alignment=False)
        got = rec["metrics"]
        assert got[f"jproj_{proto}"] == pytest.approx(ref["jproj"], rel=1e-9, abs=1e-12)
        assert got[f"jproj_init_{proto}"] == pytest.approx(ref_init["jproj"], rel=1e-9, abs=1e-12)
        for key in ("optimal_cosine", "linear_cka"):
            assert got[f"{key}_{proto}"] == pytest.approx(ref[key], rel=1e-9)
            assert got[f"{key}_chance_{proto}"] == pytest.approx(chance[key], rel=1e-9)
    # the trained stand-in and the initial model differ, so the two J_proj are two measurements
    assert rec["metrics"]["jproj_exact"] != pytest.approx(rec["metrics"]["jproj_init_exact"], rel=1e-3)
    assert rec["n_examples"] == 3 and rec["data"]["indices"] == "0:3"


@needs_fmnist
def test_scaled_attention_values_are_the_effective_values():
    """Scaled-S (the paper's setting): V is the effective (I - S) V; chunked forwards give the same numbers."""
    cfg = _cfg("scaled_vit_tiny_patch16_224")
    model = _trained_like(cfg)
    one = _run(model, cfg, limit=4)
    two = _run(model, cfg, limit=4, batch_size=2)
    for name in K.METRICS:
        assert two["metrics"][name] == pytest.approx(one["metrics"][name], rel=1e-6), name
    assert all(np.isfinite(v) for v in one["metrics"].values())


# ------------------------------------------------------------------------ the initialisation

@needs_fmnist
def test_rebuilt_init_is_the_trainers_step_zero_model(tmp_path):
    """The trainer's own model before its first step, against the init rebuilt from the saved config of a
    run of the same config trained one step."""
    from rpc_attention.train import load_run, run_training
    from rpc_attention.train.config import resolve_typed_config
    from rpc_attention.train.rundir import RunDir
    from rpc_attention.train.tasks import get_task
    from rpc_attention.train.trainer import Trainer

    base = _cfg(seed=3, epochs=1, batch_size=16, max_steps=1, log_every=1, save_every=0)
    base["data"].update(train_subset=64, val_size=16)
    cfg, config = resolve_typed_config(base=base, overrides=())
    run = RunDir(tmp_path / "step0")
    run.prepare()
    step0 = Trainer(cfg, run, get_task("classification"), torch.device("cpu"), callbacks=[], config=config).model
    trained_dir = run_training(base, tmp_path / "trained", callbacks=[])
    trained, saved_cfg = load_run(trained_dir)
    rebuilt = K.init_model(saved_cfg)
    ref = step0.state_dict()
    assert set(rebuilt.state_dict()) == set(ref)
    for key, value in rebuilt.state_dict().items():
        assert torch.equal(value, ref[key]), key
    # one step moved the weights, and another seed starts elsewhere: the equality above is not vacuous
    assert any(not torch.equal(v, ref[k]) for k, v in trained.state_dict().items())
    other = K.init_model({**saved_cfg, "train": {**saved_cfg["train"], "seed": 4}})
    assert any(not torch.equal(v, ref[k]) for k, v in other.state_dict().items())


def test_init_rebuild_leaves_the_callers_rng_alone():
    torch.manual_seed(11)
    np.random.seed(11)
    before = torch.rand(2), np.random.rand(2)
    torch.manual_seed(11)
    np.random.seed(11)
    K.init_model(_cfg())
    after = torch.rand(2), np.random.rand(2)
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1])


# ------------------------------------------------------------------------ errors and determinism

def _run_dir(tmp_path, cfg, model):
    d = tmp_path / "run"
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    return d


@needs_fmnist
def test_bad_options_and_models_give_one_clear_error(tmp_path, capsys):
    cfg = _cfg()
    run = _run_dir(tmp_path, cfg, _trained_like(cfg))
    out = tmp_path / "eval"
    for sets, message in ((["kpca.chance_draws=0"], "chance_draws must be >= 1"),
                          (["kpca.chance_drawz=2"], "did you mean kpca.chance_draws")):
        args = ["eval", "--run", str(run), "--suite", "kpca", "--out", str(out)]
        assert main(args + sum((["--set", s] for s in sets), [])) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("error") == 1, err
    # head dim 8 above the 5 tokens: V_hat is undefined, said once, with the way out
    wide = _cfg(dim=16, heads=2)
    wide_run = tmp_path / "wide"
    wide_run.mkdir()
    (wide_run / "config.yaml").write_text(yaml.safe_dump(wide))
    save_file({k: v.contiguous() for k, v in K.init_model(wide).state_dict().items()}, str(wide_run / "model.safetensors"))
    assert main(["eval", "--run", str(wide_run), "--suite", "kpca", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "Dv=8 > N=5" in err and "num_heads" in err
    with pytest.raises(ValueError, match="no run config"):
        S.get_suite("kpca").check({"task": "classification", "data": cfg["data"]}, {})


def test_unregistered_suite_names_its_registration():
    saved = dict(S._SUITES)
    S._SUITES.pop("kpca", None)
    try:
        with pytest.raises(ValueError, match=r"register_suites\(\) registers it"):
            S.get_suite("kpca")
    finally:
        S._SUITES.clear()
        S._SUITES.update(saved)


@needs_fmnist
def test_seeded_twice_gives_identical_numbers_and_the_seed_moves_only_the_chance_level(tmp_path, capsys):
    cfg = _cfg()
    run = _run_dir(tmp_path, cfg, _trained_like(cfg))
    for name in ("a", "b"):
        torch.rand(3)  # draws between the runs must not matter
        assert main(["eval", "--run", str(run), "--suite", "kpca", "--limit", "2", "--out", str(tmp_path / name)]) == 0
    a, b = (json.loads((tmp_path / n / "kpca.json").read_text()) for n in ("a", "b"))
    assert json.dumps(a["metrics"]) == json.dumps(b["metrics"])
    seeded = _run(_trained_like(cfg), cfg, limit=2, seed=1)["metrics"]
    for name, value in a["metrics"].items():
        if "chance" in name:
            assert seeded[name] != value, name
        else:
            assert seeded[name] == value, name
