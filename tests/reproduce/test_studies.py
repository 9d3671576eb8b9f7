"""Study presets: which models run with which seeds, and what the study tells the report about it."""

import pytest

from rpc_attention.reproduce import StudyError, get_study


def test_quick_study_runs_three_seeds_per_vision_model_and_one_lm_seed():
    study = get_study("quick")
    vision = [m for m in study.models if m.family == "vision"]
    lm = [m for m in study.models if m.family == "lm"]
    assert {m.key for m in vision} == {"symvit", "rpc6", "rpc2all", "rpc_pcp", "rpc_robust"}
    assert all(m.seeds == [0, 1, 2] for m in vision)
    assert [m.seeds for m in lm] == [[0], [0]]
    # fewer LM seeds than vision seeds: the report is told so
    assert any("language-model pair is trained with 1 seed" in n for n in study.notes)


def test_lm_seeds_setting_and_no_note_when_the_seeds_match():
    study = get_study("quick", ["seeds=0,1", "lm_seeds=0,1"])
    assert all(m.seeds == [0, 1] for m in study.models)
    assert not study.notes
    # without lm_seeds the LM pair follows the vision seeds (fmnist-full)
    full = get_study("fmnist-full")
    assert all(m.seeds == [0, 1, 2] for m in full.models if m.family == "lm")


def test_pgd_estimate_follows_the_study_steps_and_budgets():
    from rpc_attention.evaluate.suites import get_suite
    from rpc_attention.reproduce import build_stages
    from rpc_attention.reproduce import estimates as E

    assert E.eval_estimate(get_suite("pgd").cost, 200, n_eps=3, steps=10) < E.eval_estimate(get_suite("pgd").cost, 200, n_eps=3, steps=20)
    assert E.eval_estimate(get_suite("pgd").cost, 200, n_eps=3) < E.eval_estimate(get_suite("pgd").cost, 200, n_eps=6)

    def pgd_estimate(settings):
        stages = build_stages(get_study("quick", settings))
        return next(s.estimate_s for s in stages if s.name == "eval.symvit-s0.pgd")

    # 200 images x 3 eps x 10 steps: about twice the cost at 20 steps (the fixed overhead aside)
    short, long = pgd_estimate([]), pgd_estimate(["pgd_steps=20"])
    assert 1.7 < (long - E.EVAL_OVERHEAD_S) / (short - E.EVAL_OVERHEAD_S) < 2.0


def test_quick_study_runs_the_patch_attack_on_the_listed_models():
    study = get_study("quick")
    patch = next(e for e in study.evals if e.suite == "patch")
    assert patch.models == ["symvit", "rpc6", "rpc_robust"] and patch.limit == 100 and patch.steps == 20
    assert patch.sets == ["patch.steps=20"]
    claim = next(c for c in study.claims if c.id == "patch")
    assert (claim.metric, claim.baseline, claim.rpc) == ("top1@1patch", "symvit", "rpc_robust")
    # a listed model the study leaves out is skipped; a name no study model has is refused
    bare = get_study("quick", ["preset_rpc_robust="])
    assert next(e for e in bare.evals if e.suite == "patch").models == ["symvit", "rpc6"]
    import pytest

    from rpc_attention.reproduce import StudyError
    with pytest.raises(StudyError, match="patch_models: no model rpc7"):
        get_study("quick", ["patch_models=symvit,rpc7"])
    # the estimate follows the steps
    from rpc_attention.reproduce import build_stages

    def estimate(settings):
        return next(s.estimate_s for s in build_stages(get_study("quick", settings)) if s.name == "eval.symvit-s0.patch")
    assert estimate(["patch_steps=40"]) > 1.8 * estimate([]) - 5


def test_fmnist_studies_detect_ood_on_the_8x8_digits_with_the_energy_score_and_keep_sparse_claims_apart():
    for name in ("smoke", "quick", "fmnist-full"):
        study = get_study(name)
        ood = next(e for e in study.evals if e.suite == "ood")
        assert ood.sets == ["ood.ood_set=digits8x8"], name
        claims = {c.id: c for c in study.claims}
        assert (claims["ood_aupr"].suite, claims["ood_aupr"].metric) == ("ood", "AUPR_energy")
        assert "sparse" not in claims  # no claim on a mean of input-level and key corruption
        assert (claims["sparse_input"].metric, claims["key_corruption"].metric) == ("mean_top1_input", "mean_top1_keys")
        assert "synthetic test of the mechanism" in claims["key_corruption"].says


def test_quick_study_measures_robust_pap_on_the_key_corruption_dose_response():
    study = get_study("quick")
    robust = next(m for m in study.models if m.key == "rpc_robust")
    assert robust.preset == "fmnist-rpc-symvit-robust"
    sparse = next(e for e in study.evals if e.suite == "sparse")
    assert "rpc_robust" in sparse.models and "sparse.key_magnitude=5,20,100" in sparse.sets
    claim = next(c for c in study.claims if c.id == "sparse_keys")
    assert (claim.metric, claim.baseline, claim.rpc) == ("mean_top1_keys", "symvit", "rpc_robust")
    assert "synthetic test of the mechanism" in claim.says
    # an empty preset leaves the model and its claim out
    bare = get_study("quick", ["preset_rpc_robust="])
    assert "rpc_robust" not in {m.key for m in bare.models} and "sparse_keys" not in {c.id for c in bare.claims}
    for other in ("smoke", "fmnist-full"):  # the quick study's addition only
        assert "rpc_robust" not in {m.key for m in get_study(other).models}
        assert next(e for e in get_study(other).evals if e.suite == "sparse").sets == []


def test_lm_gap_study_pairs_four_language_models_on_three_seeds():
    from rpc_attention.reproduce.studies import get_study

    st = get_study("lm-gap")
    assert [m.key for m in st.models] == ["symlm", "rpc_symlm", "rpc_symlm_s0", "rpc2_symlm_s0"]
    assert all(m.seeds == [0, 1, 2] for m in st.models)
    # one schedule for every model; the S = 0 rows differ from the paper's row only by their own settings
    common = st.model("symlm").overrides
    assert st.model("rpc_symlm").overrides == common
    assert st.model("rpc_symlm_s0").overrides == common + ["model.kwargs.lambd=.inf"]
    assert st.model("rpc2_symlm_s0").overrides == common + ["model.kwargs.lambd=.inf", "model.kwargs.n_iter=2"]
    assert {c.rpc for c in st.claims} == {"rpc_symlm", "rpc_symlm_s0", "rpc2_symlm_s0"}
    assert all(c.baseline == "symlm" and c.metric == st.claims[0].metric and c.family == "lm" for c in st.claims)


def test_lm_gap_study_refuses_a_single_seed():
    import pytest

    from rpc_attention.reproduce.studies import StudyError, get_study

    with pytest.raises(StudyError, match="at least two"):
        get_study("lm-gap", ["seeds=[0]"])


def test_decide_study_runs_the_seeds_the_pilot_power_calculation_asks_for():
    from scipy import stats

    from rpc_attention.report.power import power
    from rpc_attention.reproduce import build_stages
    from rpc_attention.reproduce import study_data as D

    study = get_study("decide")
    families = {c.id: c.family for c in study.claims}
    assert families["clean"] == families["mce"] == "primary" and families["sparse_keys"] == "own"
    assert "primary" in families.values() and not {"lm"} & set(families.values())
    n = D.DECIDE_SEEDS
    assert all(m.seeds == list(range(n)) for m in study.models)
    assert {m.key for m in study.models} == {"symvit", "rpc6", "rpc_robust"}
    # the seeds: the first n at which each pilot claim has 80 % power at its target (clean: sd 1.25 / 1.23,
    # margin 0.25, target 1.0, Holm's first step over the 2 primary claims), computed here straight from scipy
    sd = 1.25 / 1.23
    first = next(k for k in range(2, 200)
                 if stats.nct.sf(stats.t.ppf(1 - 0.05 / 4, k - 1), k - 1, 0.75 * k ** 0.5 / sd) >= 0.8)
    assert D.pilot_seeds()["clean"] == first and n == max(D.pilot_seeds().values())
    assert power(1.0, sd, n, 0.25, family=2) >= 0.8
    # within 3 hours by the pipeline's own estimate, and the description says how many seeds
    assert sum(s.estimate_s for s in build_stages(study)) <= D.DECIDE_HOURS * 3600
    assert f"at the {n} seeds" in study.description
    # the quick study's description states its measured time, not a guess
    assert "8 min 34 s" in get_study("quick").description and "18 minutes" not in get_study("quick").description


def test_patch_study_trains_the_variants_and_evaluates_the_controls_on_the_symvit_runs():
    from rpc_attention.reproduce import build_stages

    st = get_study("patch")
    keys = [m.key for m in st.models]
    assert keys == ["symvit", "rpc6", "rpc_robust", "rpc_values8", "rpc_rows", "symvit_clip", "symvit_drop"]
    assert all(m.seeds == [0, 1, 2, 3, 4] for m in st.models)
    assert st.model("rpc_rows").overrides[-3:] == ["model.kwargs.lambd=8.0", "model.kwargs.lowrank=values",
                                                   "model.kwargs.row_lambd=6.0"]
    assert [ev.suite for ev in st.evals] == ["patch"] and st.evals[0].models == keys and st.evals[0].limit == 200
    assert {c.rpc for c in st.claims} == set(keys) - {"symvit"}
    assert all(c.baseline == "symvit" and c.metric == "top1@1patch" and c.target == 10.0 for c in st.claims)
    stages = {s.name: s for s in build_stages(st)}
    # the controls are not trained: their evaluations load the SymViT run of the same seed with the control
    assert "train.symvit_clip-s0" not in stages and "train.symvit-s0" in stages
    drop = stages["eval.symvit_drop-s2.patch"]
    assert drop.deps == ["train.symvit-s2"]
    assert (drop.params["source_run"], drop.params["model_kwargs"]) == ("symvit-s2", {"key_control": "drop",
                                                                                      "key_control_level": 6.0})
    assert "source_run" not in stages["eval.symvit-s2.patch"].params  # trained models: as in every study
    level = get_study("patch", ["clip_level=2.5", "controls=false"])
    assert "symvit_clip" not in [m.key for m in level.models]
    assert get_study("patch", ["clip_level=2.5"]).model("symvit_clip").model_kwargs["key_control_level"] == 2.5


def test_certify_study_trains_each_model_plainly_and_masking_aware():
    st = get_study("certify")
    keys = [m.key for m in st.models]
    assert keys == ["symvit", "rpc6", "rpc_robust", "symvit_md", "rpc6_md", "rpc_robust_md"]
    assert all(m.seeds == [0, 1, 2, 3, 4] for m in st.models)
    assert st.model("rpc6_md").overrides[-1] == "train.token_drop=0.5"
    assert not any("token_drop" in o for o in st.model("rpc6").overrides)
    assert st.model("rpc6_md").preset == st.model("rpc6").preset
    assert [ev.suite for ev in st.evals] == ["certify"] and st.evals[0].models == keys and st.evals[0].limit == 100
    assert "certify.attack_steps=10" in st.evals[0].sets
    assert {(c.baseline, c.rpc) for c in st.claims} == {("symvit_md", "rpc6_md"), ("symvit_md", "rpc_robust_md"),
                                                         ("symvit", "rpc6"), ("symvit", "rpc_robust"),
                                                         ("symvit", "symvit_md")}
    assert all(c.metric == "certified_top1_patch" and c.family == "own" for c in st.claims)
    assert "train.token_drop=0.25" in get_study("certify", ["token_drop=0.25"]).model("symvit_md").overrides
    with pytest.raises(StudyError, match="token_drop"):
        get_study("certify", ["token_drop=0"])


def test_the_stage_counts_docs_reproduce_gives_are_the_studies_of_the_code():
    import re
    from pathlib import Path

    from rpc_attention.reproduce import build_stages

    text = (Path(__file__).resolve().parents[2] / "docs" / "reproduce.md").read_text()
    (smoke,) = re.findall(r"The `smoke` study is (\d+) stages", text)
    (quick,) = re.findall(r"`quick`\s+study \(`make demo`: (\d+) stages", text)
    assert int(smoke) == len(build_stages(get_study("smoke")))
    assert int(quick) == len(build_stages(get_study("quick")))
