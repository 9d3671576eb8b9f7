"""A suite defined here (one class: its options and its function; one registration call) reaches every floor that asks suites:
`rpc-attention eval`, a study's evaluations and stages (with its cost estimate), and the report's table."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from rpc_attention.cli import main
from rpc_attention.evaluate import suites as S
from rpc_attention.evaluate.inputs import eval_batches, norm_stats
from rpc_attention.evaluate.suites import Column, CommonOptions, Cost, StudyUse, register_suite


@dataclass(frozen=True)
class WideMargin(CommonOptions):
    """A toy suite: the share (%) of test images whose top logit beats the runner-up by more than ``gap``."""

    gap: float = 1.0

    @staticmethod
    def run(model, cfg, run_dir, opts):
        n, batches = eval_batches(cfg, "test", opts.get("limit"), int(opts["batch_size"]), desc="wide-margin")
        wide = 0
        for xb, _ in batches():
            mean, std = norm_stats(cfg, xb.shape[1])
            with torch.no_grad():
                logits = model((xb - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)).float()
            top2 = logits.topk(2, dim=-1).values
            wide += int((top2[:, 0] - top2[:, 1] > float(opts["gap"])).sum())
        return {"metrics": {"wide_margin": 100.0 * wide / n}, "n_examples": n, "protocol": "toy: top-2 logit gap"}


@pytest.fixture()
def toy_suite():
    saved = {s.name: s for s in S.all_suites()}
    yield register_suite(
        "wide-margin", WideMargin.run, options=WideMargin, description="toy suite", metrics=("wide_margin",),
        cost=Cost(forward=3), columns=(Column("vision", "wide_margin", "wide-margin share (%)"),),
        study=StudyUse(limit="attack_limit"))
    S._SUITES.clear()
    S._SUITES.update(saved)


def test_toy_suite_runs_in_eval(toy_suite, tiny_run, tmp_path, capsys):
    assert main(["eval", "--suite", "list"]) == 0
    assert "wide-margin" in capsys.readouterr().out
    out = tmp_path / "eval"
    assert main(["eval", "--run", str(tiny_run), "--suite", "wide-margin", "--set", "wide-margin.gap=0",
                 "--limit", "16", "--out", str(out)]) == 0
    rec = json.loads((out / "wide-margin.json").read_text())
    assert rec["settings"]["gap"] == 0.0 and rec["n_examples"] == 16
    assert rec["metrics"]["wide_margin"] == pytest.approx(100.0)  # every gap is > 0 (ties have measure zero)
    assert main(["eval", "--run", str(tiny_run), "--suite", "wide-margin", "--set", "wide-margin.gapp=1",
                 "--out", str(out)]) == 2  # its options are checked like a built-in suite's


def _fake_train(ctx):
    rd = ctx.out_dir / "runs" / ctx.params["run"]
    S.atomic_write_text(rd / "config.yaml", "data: {name: fashion_mnist}\ntrain: {seed: 0}\n")
    S.atomic_write_text(rd / "metrics.jsonl", "")
    return {"outputs": {"run_dir": str(rd)}}


def _fake_eval(ctx):
    p = ctx.params
    value = {"symvit": 40.0, "rpc6": 55.0}.get(p["model"], 50.0)
    metrics = {"wide_margin": value} if p["suite"] == "wide-margin" else {"top1": value + 30}
    out = ctx.out_dir / "runs" / p["run"] / "eval" / f"{p['suite']}.json"
    S.atomic_write_json(out, {"suite": p["suite"], "metrics": metrics, "rows": [], "n_examples": 10})
    return {"outputs": {"json": str(out)}}


def test_toy_suite_in_a_study_and_its_report(toy_suite, tmp_path):
    from rpc_attention.reproduce import StageSkipped, make_pipeline
    from rpc_attention.reproduce import estimates as E
    from rpc_attention.reproduce.studies import build_stages, get_study

    study = get_study("smoke", ["suites=[clean,wide-margin]", "lm=false", "attack_limit=20"])
    ev = next(e for e in study.evals if e.suite == "wide-margin")
    assert ev.limit == 20 and ev.models == ["symvit", "rpc6", "rpc2all", "rpc_pcp"]
    stages = build_stages(study)
    toy = next(s for s in stages if s.name == "eval.rpc6-s0.wide-margin")
    rpc6 = study.model("rpc6")
    assert toy.estimate_s == E.eval_estimate(toy_suite.cost, 20, rpc6.cost)
    assert toy.estimate_s > E.eval_estimate(Cost(forward=1), 20, rpc6.cost)  # its own cost, not a default
    def skip(ctx):
        raise StageSkipped("not part of this test")

    for s in stages:
        s.fn = {"train": _fake_train, "eval": _fake_eval, "analyze": skip}.get(s.kind, s.fn)
    summary = make_pipeline(study, tmp_path, stages=stages, log=lambda m: None).run()
    assert not summary["failed"], summary
    res = json.loads((tmp_path / "results.json").read_text())
    table = res["tables"]["vision"]
    assert [c["key"] for c in table["columns"]] == ["clean:top1", "wide-margin:wide_margin"]
    cells = {r["model"]: r["cells"]["wide-margin:wide_margin"]["mean"] for r in table["rows"]}
    assert cells == {"symvit": 40.0, "rpc6": 55.0, "rpc2all": 50.0, "rpc_pcp": 50.0}
    assert "wide-margin share (%)" in (tmp_path / "report.md").read_text()
    with pytest.raises(ValueError, match="unknown suite 'wide-margn'"):
        get_study("smoke", ["suites=[clean,wide-margn]"])


def test_table_columns_are_placed_by_position_not_import_order():
    from rpc_attention.report.collect import table_columns

    assert [f"{s}:{c.metric}" for s, c in table_columns("vision")] == [
        "clean:top1", "clean:top5", "fgsm:mean_top1", "pgd:mean_top1", "autoattack:top1@1/255",
        "square:top1@1/255", "noise:mean_top1", "corruptions:mCE", "corruptions:mean_corruption_error",
        "ood:AUPR_msp", "ood:AUPR_energy", "ood:AUROC_energy", "sparse:mean_top1_input", "sparse:mean_top1_keys",
        "patch:top1@1patch", "patch:top1@2patch", "certify:certified_top1_patch", "imagenet-a:top1", "imagenet-r:top1"]
    assert [c.paper for _, c in table_columns("lm") if c.paper] == ["lm_ppl", "lm_wordswap"]
