"""The report's first screen on one-seed claims (the smoke study's case): one table per family under its
rule, and notes that never speak of "the 0 claims" when no claim has a p."""

from rpc_attention.report.families import by_family, family_tables
from rpc_attention.report.render import _verdicts_section
from rpc_attention.report.verdict import FAMILIES, UNRESOLVED


def _claim(cid, family, diff):
    return {"id": cid, "title": f"claim {cid}", "family": family, "higher": True, "margin": 0.5, "suite": "clean",
            "metric": "top1", "verdict": UNRESOLVED, "reason": "one seed", "baseline_label": "B", "rpc_label": "R",
            "baseline_values": [70.0], "rpc_values": [70.0 + diff], "paper": None,
            "effect": {"baseline_mean": 70.0, "rpc_mean": 70.0 + diff, "baseline_std": None, "rpc_std": None},
            "intervals": {"seeds": ["0"], "per_seed_diff": {"0": diff}, "seed_ci": None, "bootstrap": None,
                          "t_test": None, "tests": None, "p_holm": None, "family": 0, "min_detectable": None}}


CLAIMS = [_claim("a", "secondary", 1.0), _claim("b", "primary", -0.5), _claim("c", "own", 2.0), _claim("d", "lm", 0.1)]


def test_one_table_per_family_in_family_order_each_under_its_rule():
    assert list(by_family(CLAIMS)) == ["primary", "secondary", "own", "lm"]
    text = "\n".join(family_tables(CLAIMS))
    titles = [FAMILIES[f].title for f in ("primary", "secondary", "own", "lm")]
    positions = [text.index(f"### {t}") for t in titles]
    assert positions == sorted(positions)
    for name in ("primary", "secondary", "own", "lm"):
        assert f"*Rule: {FAMILIES[name].rule}.*" in text
    assert "| claim b | clean: top1 (higher better) | -0.50 one seed | — | 0.5 | **unresolved (one seed)** |" in text


def test_notes_without_any_p_never_say_zero_claims():
    text = "\n".join(_verdicts_section({"figures": []}, CLAIMS))
    assert "0 claims" not in text and "2 x 0" not in text
    assert "No claim has a p" in text
    # with a p in one family, the note counts that family only
    CLAIMS[1]["intervals"]["family"] = 2
    try:
        text = "\n".join(_verdicts_section({"figures": []}, CLAIMS))
    finally:
        CLAIMS[1]["intervals"]["family"] = 0
    assert "over its claims that have a p (2 primary)" in text


def test_a_claim_without_spread_counts_in_its_family_with_p_1():
    # Holm's family is fixed before the data: a claim whose per-seed differences are all equal enters with
    # p = 1 (no adjusted p of its own), so the other claim's p is doubled, not left alone
    from types import SimpleNamespace

    from rpc_attention.report.collect import _holm_by_family
    from rpc_attention.report.intervals import margin_tests

    def row(diffs):
        c, e = SimpleNamespace(family="primary", margin=0.5), SimpleNamespace(margin=0.5)
        iv = {"per_seed_diff": dict(enumerate(diffs)), "tests": margin_tests(diffs, 0.5)}
        return (c, None, None, None, None, e, iv)

    flat, noisy = row([2.0, 2.0, 2.0]), row([2.0, 2.4, 1.7])
    _holm_by_family([flat, noisy])
    assert flat[-1]["p_holm"] is None and flat[-1]["family"] == noisy[-1]["family"] == 2
    assert noisy[-1]["p_holm"] == 2 * noisy[-1]["tests"]["p"]
