import argparse

from rpc_attention.cli import main
from rpc_attention.cli.pap_demo import corruption_table


def test_pap_demo_prints_table(capsys):
    assert main(["pap-demo", "--tokens", "16", "--head-dim", "8", "--trials", "2"]) == 0
    out = capsys.readouterr().out
    assert "| symmetric attention (plain) | 1 |" in out and out.count("RPC / PAP") == 4


def test_pap_demo_six_iterations_more_robust_than_plain():
    args = argparse.Namespace(tokens=64, heads=2, head_dim=16, rank=2, fraction=0.05, magnitude=5.0,
                              lambd=4.0, trials=4, seed=0)
    rows = {(name.split()[0], n): change for name, n, change in corruption_table(args)}
    assert rows[("RPC", 6)] < rows[("symmetric", 1)]


def test_pap_demo_bad_fraction_exits_2(capsys):
    assert main(["pap-demo", "--fraction", "2"]) == 2
    assert "--fraction" in capsys.readouterr().err
