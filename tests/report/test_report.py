"""The report on a study whose stages are fakes writing outputs in the components' formats: tables,
verdicts, results.json, figures (real PNGs), HTML with inlined images, skipped stages."""

import json
import math
import re

import pytest
import torch

from rpc_attention.evaluate.corruptions import declare_mce
from rpc_attention.evaluate.per_example import PerExample, score_record
from rpc_attention.report.intervals import example_se
from rpc_attention.reproduce import StageSkipped, get_study, make_pipeline
from rpc_attention.reproduce.pipeline import atomic_write_json, atomic_write_text
from rpc_attention.reproduce.studies import build_stages

BASE = {"symvit": 80.0, "rpc6": 82.0, "rpc2all": 81.0, "rpc_pcp": 79.0, "rpc_robust": 80.5, "symlm": 50.0, "rpc_symlm": 48.0}
# S activity the fake training records: share of non-zero S entries per RPC model (0: S never fired)
FRAC = {"rpc6": 0.0, "rpc2all": 0.0, "rpc_pcp": 0.12, "rpc_symlm": 0.4}


def _num(run):
    # the RPC models move by a little more per seed than the baselines, so the per-seed differences have a
    # spread (differences without spread give no p)
    key, seed = run.rsplit("-s", 1)
    jitter = 0.0 if key in ("symvit", "symlm") else 0.002
    return key, int(seed), BASE[key] + (0.3 + jitter) * int(seed)


def fake_train(ctx):
    run = ctx.params["run"]
    rd = ctx.out_dir / "runs" / run
    atomic_write_text(rd / "config.yaml", "data: {name: fashion_mnist, train_subset: 512}\ntrain: {max_steps: 20, seed: 0}\n")
    lines = [json.dumps({"step": i * 10, "split": "train", "loss": 2.0 / (i + 1), "acc": 50.0}) for i in range(5)]
    lines += [json.dumps({"step": 20 * e, "epoch": e, "split": "val", "acc1": 70.0 + e, "loss": 1.0}) for e in (1, 2)]
    lines += [json.dumps({"step": 40, "split": "test", "final": True, "acc1": 72.0, "loss": 0.9})]
    atomic_write_text(rd / "metrics.jsonl", "\n".join(lines) + "\n")
    atomic_write_text(rd / "model.safetensors", "fake")
    key = run.rsplit("-s", 1)[0]
    if key in FRAC:  # what the sparsity callback puts into final_metrics.json
        block = {"layer": "blocks.0.attn", "block": 0, "causal": key == "rpc_symlm", "n_iter": 6, "lambd": 4.0,
                 "threshold": "lambda_mu", "mu_mode": None, "model_dim": 96, "tokens": 3400,
                 "frac_nonzero": FRAC[key], "frac_rows_nonzero": min(1.0, 5 * FRAC[key]), "s_over_k": FRAC[key],
                 "tau_mean": 23.6, "tau_max": 30.0, "abs_k_median": 0.2, "abs_k_p99": 1.0, "abs_k_max": 1.59,
                 "verdict": "fired" if FRAC[key] else "acted as iterated attention"}
        atomic_write_json(rd / "final_metrics.json", {"step": 40, "acc1": 72.0, "sparsity": {
            "epoch": 2, "probe": {"split": "val", "examples": 200, "task": "classification"}, "blocks": [block],
            "verdict": block["verdict"]}})
    return {"outputs": {"run_dir": str(rd)}}


N_EXAMPLES = 1000


def _bits(pct):
    """A per-example record string: the first pct % of the examples right (so models are paired)."""
    k = round(pct * N_EXAMPLES / 100)
    return "1" * k + "0" * (N_EXAMPLES - k)


def fake_eval(ctx):
    p = ctx.params
    key, seed, base = _num(p["run"])
    suite = p["suite"]
    rows, metrics, per_example, extra = [], {}, None, {}
    if suite == "clean":
        metrics = {"top1": base, "top5": 99.0}
        per_example = {"indices": f"0:{N_EXAMPLES}", "correct": {"clean": _bits(base)},
                       "metrics": {"top1": {"settings": ["clean"]}}}
    elif suite in ("fgsm", "pgd"):
        for e in range(1, 4):
            rows.append({"eps": f"{e}/255", "top1": base - 10 * e, "top5": 90.0})
            metrics[f"top1@{e}/255"] = base - 10 * e
        metrics["clean_top1"] = base
        metrics["mean_top1"] = sum(r["top1"] for r in rows) / len(rows)
        per_example = {"indices": f"0:{N_EXAMPLES}", "correct": {r["eps"]: _bits(r["top1"]) for r in rows},
                       "metrics": {"mean_top1": {"settings": [r["eps"] for r in rows]}}}
    elif suite == "corruptions":
        names = ("gaussian_noise", "contrast")
        for c in names:
            row = {"corruption": c, **{f"s{s}": 100 - base + s for s in range(1, 6)}}
            row["mean_error"] = 100 - base + 3
            rows.append(row)
        metrics = {"mean_corruption_error": 100 - base + 3}
        settings = [f"{c}@{s}" for c in names for s in range(1, 6)]
        record = PerExample(range(N_EXAMPLES))
        for c in names:
            for s in range(1, 6):
                record.add(f"{c}@{s}", torch.tensor([b == "1" for b in _bits(base - s)]))
        record.metric("mean_corruption_error", settings, error=True)
        if any("baseline=" in s for s in p["sets"]):
            assert "{out}" in "".join(p["sets"])  # resolved to the study dir by the real eval stage
            ref = (100 - BASE["symvit"] - 0.3 * seed + 3) / 100
            metrics["mCE"] = 100 * (100 - base + 3) / (100 * ref)
            declare_mce(record, names, {c: ref for c in names})
        per_example = record.as_dict()
        extra = {"errors": {c: [(100 - base + s) / 100 for s in range(1, 6)] for c in names}}
    elif suite == "ood":
        metrics = {"AUPR_msp": base - 40, "AUROC_msp": 90.0, "AUPR_energy": base - 30, "AUROC_energy": 92.0}
    elif suite == "sparse":
        rows = [{"corruption": "none (clean)", "level": "-", "top1": base},
                {"corruption": "salt-and-pepper", "level": "5% of pixels", "top1": base - 20},
                {"corruption": "key corruption", "level": "5% of block-1 keys, +-5 std", "top1": base - 30}]
        metrics = {"top1_clean": base, "mean_top1_input": base - 20}  # no key mean: those claims go unmeasured
    elif suite == "ppl":
        metrics = {"test_ppl_sliding": base, "valid_ppl_sliding": base + 1}
        blocks = [[math.log(base) * 10, 10]] * 5   # NLL per block of 10 tokens: exp(sum / count) = base
        per_example = {"kind": "ppl", "by_metric": {"test_ppl_sliding": score_record("ppl", {"test_ppl_sliding": blocks})}}
    elif suite == "wordswap":
        raise StageSkipped("word swap needs the LM component")
    rec = {"suite": suite, "metrics": metrics, "rows": rows, "n_examples": N_EXAMPLES, "protocol": f"fake {suite}",
           "data": {"dataset": "fashion_mnist"}, "settings": {}, **extra}
    if per_example is not None:
        rec["per_example"] = per_example
    out = ctx.out_dir / "runs" / p["run"] / "eval" / f"{suite}.json"
    atomic_write_json(out, rec)
    return {"outputs": {"json": str(out)}}


def fake_analyze(ctx):
    out = ctx.out_dir / ctx.params["out"]
    stat = lambda m, s=0.01: {"mean": m, "std": s, "n": 10}  # noqa: E731
    layer = lambda i: {"name": f"blocks.{i}.attn", "kind": "sym", "tokens": 17, "heads": 3,  # noqa: E731
                       "jproj": stat(-2.0 + 0.1 * i), "phi2": stat(1e-3), "h2": stat(2.0 - 0.1 * i),
                       "optimal_cosine": stat(0.2), "linear_cka": stat(0.1), "rbf_cka": stat(0.3), "direct_cosine": stat(0.05)}
    model = {"jproj": stat(-1.9), "phi2": stat(1e-3), "h2": stat(1.9), "optimal_cosine": stat(0.21),
             "linear_cka": stat(0.11), "rbf_cka": stat(0.31), "direct_cosine": stat(0.05),
             "gamma": {"learned": stat(5.0), "perturbed": stat(0.1), "random": stat(6.0)}}
    kp = {"protocols": {"paper": {"model": model, "layers": [layer(i) for i in range(3)]},
                        "exact": {"model": model, "layers": [layer(i) for i in range(3)]}},
          "chance": {"17x32": {"optimal_cosine": stat(0.18), "linear_cka": stat(0.2), "rbf_cka": stat(0.25),
                               "direct_cosine": stat(0.0)}},
          "history": [{"epoch": e, "jproj/paper/model/jproj": -1.0 * e, "jproj/paper/model/phi2": 1e-3,
                       "jproj/paper/model/h2": 1.0 * e} for e in (1, 2)],
          "meta": {"model": "symvit"}, "failures": []}
    atomic_write_json(out / "kpca.json", kp)
    return {"outputs": {"dir": str(out)}}


def test_report_on_fake_two_seed_study(tmp_path):
    # one test function on purpose: the fake study and its report are built once
    out = make_study(tmp_path / "study")
    check_report_files_and_tables(out)
    check_figures_are_pngs_and_html_inlines_them(out)
    check_verify_recomputes_from_the_examples(out)
    check_rerun_skips_everything_and_keeps_report(out)


def make_study(out):
    study = get_study("quick", ["seeds=0,1"])
    stages = build_stages(study)
    fakes = {"train": fake_train, "eval": fake_eval, "analyze": fake_analyze}
    for s in stages:
        if s.kind in fakes:
            s.fn = fakes[s.kind]
    pipe = make_pipeline(study, out, stages=stages, log=lambda m: None)
    summary = pipe.run()
    assert not summary["failed"], summary
    return out


def check_report_files_and_tables(study_dir):
    md = (study_dir / "report.md").read_text()
    assert "## Verdicts" in md and "## Verdicts in detail" in md and "## Setup" in md and "### Time per stage" in md
    assert "## Image classification and robustness" in md and "## Language modelling" in md
    # our numbers with std over the two seeds next to the paper's row
    assert "80.15 ± 0.21 (n=2)" in md          # SymViT clean top-1: mean of 80.0, 80.3
    assert "*paper: baseline (ImageNet-scale)*" in md and "70.44" in md and "71.49" in md
    lm_section = md[md.index("## Language modelling"):]
    assert "*paper: baseline (WikiText-103)*" in lm_section and "ImageNet" not in lm_section.split("\n## ")[0]
    # the report stage that writes the page is not listed as pending
    assert "`report`: running" not in md and "| report | report | running" not in md
    # per-eps table and corruption table
    assert "| 1/255 |" in md and "| gaussian_noise |" in md
    # verdicts from the rule: RPC-6 clean +2 points on both seeds, but the test examples (1,000, paired bits
    # differing on 2 % of them) give an example part of about 0.44 points, and two seeds a t_1 critical value
    # of 25.5 at Holm's first step: the one interval reaches 0 -> inconclusive
    res = json.loads((study_dir / "results.json").read_text())
    claims = {c["id"]: c for c in res["claims"]}
    clean = claims["clean"]
    assert clean["effect"]["delta"] == pytest.approx(2.001)
    tests = clean["intervals"]["tests"]
    se_ex = example_se(clean["intervals"]["bootstrap"]["pooled"])
    assert 0.3 < se_ex < 0.6 and tests["df"] == 1
    assert tests["se"] == pytest.approx(math.sqrt(tests["se_seeds"] ** 2 + se_ex ** 2), rel=1e-12)
    assert clean["verdict"] == "inconclusive" and "95 % interval (seeds and examples)" in clean["reason"]
    assert claims["mce"]["verdict"] == "inconclusive"
    # one LM seed (the quick study's lm_seeds): 48 < 50 is no evidence without a noise estimate
    assert claims["lm_ppl"]["verdict"] == "unresolved (one seed)"
    assert claims["lm_wordswap"]["verdict"] == "not measured"  # stage skipped
    assert "word swap needs the LM component" in claims["lm_wordswap"]["reason"]
    # every number in the tables is in results.json
    cell = next(r for r in res["tables"]["vision"]["rows"] if r["model"] == "symvit")["cells"]["clean:top1"]
    assert cell["values"] == [80.0, 80.3]
    # the skipped stages are listed with their reason, never faked
    assert "## Skipped, failed and pending stages" in md and "eval.symlm-s0.wordswap`: skipped" in md
    assert "Verdicts are computed from the numbers by one fixed rule" in md
    # the LM pair has fewer seeds than the vision models: the setup says which model has which seeds, and why
    assert "- Seeds: SymViT, RPC-SymViT 6iter/layer1, RPC-SymViT 2iter/all-layer, RPC-SymViT 6iter/layer1, " \
           "PCP-active, RPC-SymViT robust PAP 2iter/layer1: 0, 1; Symlm, RPC-Symlm: 0." in md
    assert "- The language-model pair is trained with 1 seed(s) (0) and the vision models with 2" in md
    # the kernels' instruction set is recorded (float32 results depend on it) and shown in the setup
    import torch
    isa = torch.backends.cpu.get_cpu_capability()
    assert res["setup"]["cpu_capability"] == isa and f"; CPU kernels {isa}" in md
    # KPCA table shows chance baselines
    assert "(chance 0.180)" in md
    # S activity of every RPC model (vision and LM) with the rule's verdict; SymViT has none
    sp = res["sparsity"]
    assert set(sp["models"]) == {"rpc6", "rpc2all", "rpc_pcp", "rpc_robust", "rpc_symlm"}
    assert sp["models"]["rpc6"]["verdict"] == "acted as iterated attention"
    assert sp["models"]["rpc_pcp"]["verdict"] == "fired" and sp["models"]["rpc_symlm"]["verdict"] == "fired"
    section = md[md.index("## PAP's sparse step: did it fire?"):].split("\n## ")[0]
    assert "*fired* when the share of non-zero entries of S" in section
    assert "| RPC-SymViT 6iter/layer1, PCP-active | rpc_pcp-s1 | 0 | lambda_mu λ=4 | 200 val | 12 |" in section
    assert "- **RPC-SymViT 6iter/layer1**: acted as iterated attention." in section
    assert "- **RPC-Symlm**: fired." in section
    # the sparse-corruption table, every vision model; the PCP-active model's verdict rows vs SymViT
    assert "**Sparse corruption**" in md and "| key corruption: 5% of block-1 keys, +-5 std | 50.15 ± 0.21 |" in md
    assert claims["sparse_input_pcp"]["rpc"] == "rpc_pcp" and claims["sparse_input_pcp"]["baseline"] == "symvit"
    # 79 < 80 by the margin on both seeds, but two seeds and 1,000 examples cannot resolve it
    assert claims["clean_pcp"]["verdict"] == "inconclusive"
    assert claims["clean_pcp"]["paper"] == claims["clean"]["paper"] is not None
    check_intervals_and_lead(md, res)


def check_intervals_and_lead(md, res):
    claims = {c["id"]: c for c in res["claims"]}
    # per-example records on both sides: clean +2 points on the first 2 % of 1000 examples
    clean = claims["clean"]
    assert clean["verdict"] == "inconclusive"
    assert clean["intervals"]["seed_ci"]["diff"] == pytest.approx(2.001, abs=1e-9)
    pooled = clean["intervals"]["bootstrap"]["pooled"]
    assert pooled["n_seeds"] == 2 and pooled["n_examples"] == 1000 and 0 < pooled["lo"] < 2.0 < pooled["hi"]
    assert set(clean["intervals"]["bootstrap"]["per_seed"]) == {"0", "1"}
    # mCE has an example interval too: the per-example errors weighted like the metric reproduce its difference
    mce = claims["mce"]["intervals"]
    diffs = list(mce["per_seed_diff"].values())
    # (to the 0.1 point one example of 1000 weighs: the fake's per-seed jitter of 0.002 is below it)
    assert mce["bootstrap"]["pooled"]["diff"] == pytest.approx(sum(diffs) / len(diffs), abs=0.05)
    assert mce["bootstrap"]["pooled"]["hi"] < 0                 # RPC-6's error is lower on every resample
    # the fake sparse suite records no per-example data: the seed interval only, the same rule
    assert claims["sparse_input"]["intervals"]["bootstrap"] is None and claims["sparse_input"]["intervals"]["seed_ci"]
    # Holm within each family over its claims with >= 2 seeds (the LM pair has one seed: no p)
    fam = {c["id"]: (c["family"], c["intervals"]["family"]) for c in claims.values()}
    assert fam["clean"] == fam["mce"] == ("primary", 2) and fam["sparse_keys"] == ("own", 1)  # no fake key metric
    assert fam["fgsm"] == fam["clean_pcp"] == ("secondary", 8) and fam["sparse_input"] == ("own", 1)
    assert claims["lm_ppl"]["intervals"]["p_holm"] is None and claims["lm_ppl"]["intervals"]["min_detectable"] is None
    # the LM claim's example interval over token blocks, and its perplexity ratio 48 / 50
    assert "(ratio 0.960 [0.960, 0.960])" in md
    assert "p / p (Holm)" in md and "smallest resolvable" in md and "margin rule" not in md
    assert "RPC − baseline, 95 % example interval" in md and "**reproduced**" in md
    assert "![" in md and "(figures/forest_primary.png)" in md and "(figures/forest_lm.png)" in md
    # the lead: first thing after the title, at most five sentences, the same text in results.json, the
    # tables' words; the paper's claims and the library's own apart
    lead = res["lead"]["text"]
    # the first screen is the scorecard (count line, a short lead, one row per claim of the paper, the forest
    # plots); the longer lead follows it
    lines = md.split("\n")
    assert lines[2] == "## Scorecard: the paper's claims at this scale" and lines[4].startswith("**14 claims: ")
    assert md.index("(figures/forest_primary.png)") < md.index("**The answer at this scale.**") < md.index("## Verdicts")
    assert f"**The answer at this scale.** {lead}" in lines
    assert len(re.findall(r"[.!?](?:\s|$)", lead)) <= 5, lead
    assert "RPC-SymViT 6iter/layer1: acted as iterated attention;" in lead
    assert "RPC-SymViT 6iter/layer1, PCP-active: fired (up to 12 % of S entries non-zero)" in lead
    assert ("The paper's claims, primary (powered): RPC-SymViT 6iter/layer1 clean top1 +2.00 (inconclusive); "
            "RPC-SymViT 6iter/layer1 corruptions mCE") in lead
    assert "secondary (exploratory, 9 claims): " in lead
    assert "The library's own claims (not the paper's): RPC-SymViT 6iter/layer1 sparse mean_top1_input " in lead
    assert "Language model (the paper's claims): RPC-Symlm ppl test_ppl_sliding -2.00 (unresolved (one seed))" in lead
    # the first screen: one table per family, each under its rule, before the description and setup
    first = md[:md.index("## Setup")]
    for title in ("### Primary: the paper's headline", "### Secondary: the paper's other claims (exploratory)",
                  "### The library's own claims", "### Language model"):
        assert title in first
    assert first.index("### Primary") < first.index("Fashion-MNIST SymViT vs RPC-SymViT")
    assert "*Rule: confirmatory; Holm over this family at 0.05" in first
    assert "## Power of the primary claims" in md and "MDE against target" in md
    assert "adjusted within each family over its claims that have a p (2 primary, 8 secondary, 1 own)" in md
    for c in claims.values():   # every claim's verdict word in the tables is the detail table's
        assert f"**{c['verdict']}**" in md


def check_verify_recomputes_from_the_examples(study_dir):
    # the per-example records sit beside results.json, and every interval and verdict recomputes from the two
    # files alone; a changed record changes the recomputed numbers
    from rpc_attention.report.recompute import examples_path, read_examples, verify_results, write_examples

    res_path = study_dir / "results.json"
    assert examples_path(res_path).name == "examples.json.gz"
    out = verify_results(res_path)
    assert out["examples"] and out["differences"] == [], out["differences"]
    records = read_examples(examples_path(res_path))
    assert set(records) >= {"clean", "corruptions", "fgsm"}
    import shutil
    copy = study_dir.parent / "copy"
    copy.mkdir()
    shutil.copy(res_path, copy / "results.json")
    bits = records["clean"]["rpc6"]["0"]["correct"]["clean"]
    records["clean"]["rpc6"]["0"]["correct"]["clean"] = "0" * 40 + bits[40:]   # 40 examples now wrong
    write_examples(copy / "examples.json.gz", records)
    changed = {field for cid, field, _, _ in verify_results(copy / "results.json")["differences"] if cid == "clean"}
    assert {"examples.lo", "examples.hi"} <= changed


def check_figures_are_pngs_and_html_inlines_them(study_dir):
    res = json.loads((study_dir / "results.json").read_text())
    figs = [f for f in res["figures"] if f.get("path")]
    names = {f["path"] for f in figs}
    for expected in ("figures/forest_primary.png", "figures/attack_curves.png", "figures/corruption_errors.png", "figures/training_vision.png",
                     "figures/jproj_symvit-s0.png", "figures/alignment_symvit-s0.png"):
        assert expected in names
    assert not [f for f in res["figures"] if f.get("section") == "errors"]
    for f in figs:
        data = (study_dir / f["path"]).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    md = (study_dir / "report.md").read_text()
    assert "![" in md and "(figures/attack_curves.png)" in md
    html = (study_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "<table>" in html
    assert len(re.findall(r'src="data:image/png;base64,', html)) == len(figs)
    assert "figures/attack_curves.png" not in re.findall(r'src="([^"]+)"', html)


def check_rerun_skips_everything_and_keeps_report(study_dir):
    study = get_study("quick", ["seeds=0,1"])
    stages = build_stages(study)
    called = []
    for s in stages:
        if s.kind != "report":
            s.fn = lambda ctx: called.append(ctx.stage.name)
    pipe = make_pipeline(study, study_dir, stages=stages, log=lambda m: None)
    summary = pipe.run()
    # only the skipped stages are tried again (their component may have been installed since)
    assert called == ["eval.symlm-s0.wordswap", "eval.rpc_symlm-s0.wordswap"]
    assert summary["ok"][-1] == "report"   # upstream changed (the retried stages finished): refreshed
    assert "train.symvit-s0" in summary["cached"] and "eval.rpc6-s1.pgd" in summary["cached"]
