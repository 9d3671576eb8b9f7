"""Per-example correctness records of the classification suites: compact encoding, and every
declared metric is reproduced by the mean of its per-example scores."""

import numpy as np
import pytest
import torch

from rpc_attention.evaluate.inputs import Normalized, load_eval_data, norm_stats
from rpc_attention.evaluate.per_example import (
    PerExample,
    decode_bits,
    decode_indices,
    encode_bits,
    encode_indices,
    example_scores,
    has_example_record,
)
from rpc_attention.evaluate.suites import get_suite, resolve_options, run_suite


def test_bits_and_indices_round_trip():
    hits = torch.tensor([True, False, False, True, True])
    assert encode_bits(hits) == "10011"
    assert decode_bits("10011").tolist() == hits.tolist()
    assert encode_indices(range(3, 8)) == "3:8" and decode_indices("3:8").tolist() == [3, 4, 5, 6, 7]
    assert encode_indices([0, 5, 10]) == [0, 5, 10] and decode_indices([0, 5, 10]).tolist() == [0, 5, 10]
    with pytest.raises(ValueError, match="0 and 1"):
        decode_bits("0121")


def test_example_scores_average_settings_and_flip_errors():
    rec = PerExample(range(4))
    rec.add("a", torch.tensor([1, 1, 0, 0]))
    rec.add("b", torch.tensor([1, 0]))  # two batches of two examples
    rec.add("b", torch.tensor([1, 0]))
    rec.metric("mean", ["a", "b"])
    rec.metric("err", ["a"], error=True)
    d = rec.as_dict()
    assert d["correct"] == {"a": "1100", "b": "1010"} and d["indices"] == "0:4"
    assert example_scores(d, "mean").tolist() == [100.0, 50.0, 50.0, 0.0]
    assert example_scores(d, "err").tolist() == [0.0, 0.0, 100.0, 100.0]
    assert example_scores(d, "other") is None and example_scores(None, "mean") is None
    rec.add("a", torch.tensor([True]))  # one result too many
    with pytest.raises(RuntimeError, match="5 results for 4 examples"):
        rec.as_dict()


def _check_metrics_reproduced(record, n):
    pe = record["per_example"]
    # the suite's record holds what EXAMPLE_METRICS says it does, and nothing else
    assert all(has_example_record(record["suite"], name) for name in pe["metrics"]), (record["suite"], pe["metrics"])
    assert pe["indices"] == f"0:{n}"
    assert all(len(bits) == n for bits in pe["correct"].values())
    assert pe["metrics"]
    for name in pe["metrics"]:
        # a mean of n values that are multiples of 100 / (#settings): float64 rounding only
        assert example_scores(pe, name).mean() == pytest.approx(record["metrics"][name], abs=1e-9), name


def test_clean_suite_bits_are_each_examples_top1(tiny_model):  # skips without Fashion-MNIST (the fixture)
    model, cfg = tiny_model
    rec = run_suite(get_suite("clean"), model, cfg, None, resolve_options(get_suite("clean"), {}, limit=50))
    _check_metrics_reproduced(rec, 50)
    x, y = load_eval_data(cfg, "test", 50)
    with torch.no_grad():
        pred = Normalized(model, *norm_stats(cfg, 1))(x).argmax(-1)
    assert decode_bits(rec["per_example"]["correct"]["clean"]).tolist() == (pred == y).tolist()


def test_attack_sparse_and_corruption_suites_record_every_setting(tiny_model):
    model, cfg = tiny_model
    fgsm = run_suite(get_suite("fgsm"), model, cfg, None,
                     resolve_options(get_suite("fgsm"), {"fgsm.eps": "1/255,4/255"}, limit=40))
    _check_metrics_reproduced(fgsm, 40)
    assert set(fgsm["per_example"]["correct"]) == {"clean", "1/255", "4/255"}
    assert {"mean_top1", "top1@1/255", "clean_top1"} <= set(fgsm["per_example"]["metrics"])
    sparse = run_suite(get_suite("sparse"), model, cfg, None,
                       resolve_options(get_suite("sparse"), {"sparse.salt_pepper": "0.05", "sparse.occlusion": "2"},
                                       limit=40))
    _check_metrics_reproduced(sparse, 40)
    assert set(sparse["per_example"]["metrics"]["mean_top1_input"]["settings"]) == {
        "top1_salt_pepper@5%", "top1_occlusion@2"}
    assert sparse["per_example"]["metrics"]["mean_top1_keys"]["settings"] == ["top1_keys@5%"]
    corr = run_suite(get_suite("corruptions"), model, cfg, None,
                     resolve_options(get_suite("corruptions"), {"corruptions.names": "gaussian_noise,contrast"},
                                     limit=16))
    _check_metrics_reproduced(corr, 16)
    assert len(corr["per_example"]["metrics"]["mean_corruption_error"]["settings"]) == 10
    assert np.all(np.isin(example_scores(corr["per_example"], "mean_corruption_error"), np.arange(0, 101, 10)))
