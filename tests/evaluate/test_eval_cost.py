"""``rpc-attention eval`` announces a suite expected to run over a minute before it starts, with its
estimate and the ``--limit`` that shortens it; a short one is not announced."""

from rpc_attention.cli import main
from rpc_attention.cli.eval import announce_cost
from rpc_attention.evaluate.runner import select_suites


def test_long_suite_is_announced_with_an_estimate(tiny_model):
    model, cfg = tiny_model
    suites, opts = select_suites(["clean", "pgd"], {"pgd.steps": "100000"}, 100)
    lines = []
    announce_cost(suites, opts, model, cfg, lines.append)
    assert len(lines) == 1 and lines[0].startswith("[eval] pgd: about ") and "for 100 examples" in lines[0]
    assert "--limit N" in lines[0]


def test_short_evaluation_prints_no_estimate(tiny_run, tmp_path, capsys):
    assert main(["eval", "--run", str(tiny_run), "--suite", "clean", "--limit", "4", "--out", str(tmp_path)]) == 0
    assert "estimated" not in capsys.readouterr().err
