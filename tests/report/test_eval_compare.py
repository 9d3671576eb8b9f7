"""Robustness side by side (`rpc-attention compare` on evaluated runs): values, differences from the
first run and the paired example interval of report.intervals, on hand-made suite results."""

import json

import numpy as np

from rpc_attention.cli import main
from rpc_attention.evaluate.per_example import encode_bits
from rpc_attention.report.eval_compare import compare_evals, read_eval_results
from rpc_attention.report.intervals import paired_bootstrap


def _fgsm(correct_clean, correct_eps, seed=0):
    n = len(correct_clean)
    return {"suite": "fgsm", "seed": seed, "n_examples": n,
            "metrics": {"clean_top1": 100.0 * np.mean(correct_clean), "top1@1/255": 100.0 * np.mean(correct_eps)},
            "per_example": {"indices": f"0:{n}", "correct": {"clean": encode_bits(correct_clean),
                                                              "1/255": encode_bits(correct_eps)},
                            "metrics": {"clean_top1": {"settings": ["clean"]}, "top1@1/255": {"settings": ["1/255"]}}}}


def _corr(bits_noise, bits_fog):
    n = len(bits_noise[0])
    correct = {f"gaussian_noise@{s}": encode_bits(b) for s, b in enumerate(bits_noise, 1)}
    correct.update({f"fog@{s}": encode_bits(b) for s, b in enumerate(bits_fog, 1)})
    err = {c: 100.0 * (1 - np.mean(b)) for c, b in (("gaussian_noise", bits_noise), ("fog", bits_fog))}
    return {"suite": "corruptions", "seed": 0, "n_examples": n,
            "metrics": {"mean_corruption_error": float(np.mean(list(err.values())))},
            "rows": [{"corruption": c, "mean_error": e} for c, e in err.items()],
            "per_example": {"indices": f"0:{n}", "correct": correct,
                            "metrics": {"mean_corruption_error": {"settings": list(correct), "error": True}}}}


def _run(path, *records):
    (path / "eval").mkdir(parents=True)
    for rec in records:
        (path / "eval" / f"{rec['suite']}.json").write_text(json.dumps(rec))
    return path


def test_values_differences_and_the_paired_interval(tmp_path):
    rng = np.random.default_rng(0)
    clean_a, clean_b = rng.random(40) < 0.8, rng.random(40) < 0.9
    eps_a, eps_b = rng.random(40) < 0.5, rng.random(40) < 0.7
    noise_a = [rng.random(40) < 0.6 for _ in range(5)]
    noise_b = [rng.random(40) < 0.7 for _ in range(5)]
    fog = [np.ones(40, bool)] * 5
    a = _run(tmp_path / "a", _fgsm(clean_a, eps_a), _corr(noise_a, fog))
    b = _run(tmp_path / "b", _fgsm(clean_b, eps_b, seed=1), _corr(noise_b, fog))
    table = compare_evals([a, b], tmp_path / "out", resamples=300)
    rows = {(r["suite"], r["metric"]): r for r in table["rows"]}
    clean = rows[("fgsm", "clean_top1")]
    assert clean["values"] == {"a": 100.0 * clean_a.mean(), "b": 100.0 * clean_b.mean()}
    assert clean["diffs"]["b"]["diff"] == 100.0 * (clean_b.mean() - clean_a.mean())
    assert clean["diffs"]["b"]["interval"] is None  # other seed: the attacked examples are not the same
    noise = rows[("corruptions", "error:gaussian_noise")]
    assert noise["lower_is_better"] and noise["values"]["a"] == 100.0 * (1 - np.mean(noise_a))
    # the interval is report.intervals' paired bootstrap on the per-example errors of that corruption
    ref = paired_bootstrap([100.0 * (1 - np.mean(noise_a, axis=0))], [100.0 * (1 - np.mean(noise_b, axis=0))],
                           resamples=300)
    got = noise["diffs"]["b"]["interval"]
    assert (got["lo"], got["hi"]) == (ref["lo"], ref["hi"]) and got["n_examples"] == 40
    assert rows[("corruptions", "error:fog")]["diffs"]["b"]["interval"] == {
        "diff": 0.0, "lo": 0.0, "hi": 0.0, "n_examples": 40, "level": 0.95}
    assert (tmp_path / "out" / "robustness.png").is_file()
    md = (tmp_path / "out" / "robustness.md").read_text()
    assert "| b - a |" in md and "error:gaussian_noise" in md


def test_cli_compares_result_folders_and_refuses_what_it_cannot(tmp_path, capsys):
    rng = np.random.default_rng(1)
    a = _run(tmp_path / "a", _fgsm(rng.random(20) < 0.8, rng.random(20) < 0.5))
    b = _run(tmp_path / "b", _fgsm(rng.random(20) < 0.8, rng.random(20) < 0.5))
    assert main(["compare", str(a / "eval"), str(b), "--label", "base", "--label", "rpc", "--out",
                 str(tmp_path / "o"), "--resamples", "50"]) == 0
    assert "rpc - base" in capsys.readouterr().out
    assert set(read_eval_results(a)) == {"fgsm"}
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 2  # no --force
    assert "already holds" in capsys.readouterr().err
    (tmp_path / "c").mkdir()
    assert main(["compare", str(a), str(tmp_path / "c"), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "nothing to compare" in err and len(err.splitlines()) == 1


def test_the_eps_axis_says_the_sweeps_norm_and_units():
    from rpc_attention.report.eval_compare import eps_axis

    assert eps_axis({"norm": "Linf", "eps_units": "pixel [0,1]"}) == (255.0, "eps (L-inf, x 1/255)")
    assert eps_axis({}) == (255.0, "eps (L-inf, x 1/255)")   # results written before the settings had them
    assert eps_axis({"norm": "L2", "eps_units": "pixel [0,1]"}) == (1.0, "eps (L2, pixel [0,1])")
    assert eps_axis({"norm": "Linf", "eps_units": "normalised"}) == (1.0, "eps (Linf, normalised)")
