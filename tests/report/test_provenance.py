"""verify's provenance check of a pre-registered run: every stage after the plan's commit, one code commit."""

from rpc_attention.report.recompute import provenance_problems


def _res(stages, date="2026-12-06T04:00:00+00:00"):
    return {"plan": {"git": {"commit": "a" * 40, "date": date, "clean": True}}, "stages": stages}


def _st(name, started, commit="b" * 40, dirty=False):
    return {"name": name, "kind": "train", "status": "done", "started": started, "commit": commit,
            "commit_dirty": dirty}


def test_a_clean_run_has_no_problem():
    t = 1796529600.0 + 60   # 2026-12-06 04:01 UTC
    assert provenance_problems(_res([_st("train.a-s1", t), _st("train.b-s1", t + 5)])) == []


def test_early_stage_two_commits_and_changed_files_are_each_reported():
    t = 1796529600.0
    res = _res([_st("train.a-s1", t - 3600), _st("train.b-s1", t + 60, commit="c" * 40),
                _st("train.c-s1", t + 60, dirty=True)])
    got = provenance_problems(res)
    assert any("before the plan's commit" in p and "train.a-s1" in p for p in got)
    assert any("2 code commits" in p for p in got)
    assert any("differed from their commit" in p and "train.c-s1" in p for p in got)


def test_runs_without_a_plan_or_stage_commits_are_not_checked():
    assert provenance_problems({"stages": [_st("train.a-s1", 0.0)]}) == []
    old = _res([{"name": "train.a-s1", "kind": "train", "status": "done", "started": 0.0}])
    assert provenance_problems(old) == []
