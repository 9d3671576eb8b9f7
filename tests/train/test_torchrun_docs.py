"""Every ``torchrun`` line of the README and docs/ starts as written.

torchrun's own argument parser reads every option on its command line, the program's included, and
accepts unambiguous abbreviations of its options: ``--run DIR`` once stopped the documented lines at
once (``ambiguous option: --run could match --run-path, --run_path``). The lines are read from the
documents here, so the documents cannot drift from what runs.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rpc_attention.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(text):
    """The fenced code blocks of a markdown text."""
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)


def _expand(line, block):
    """``line`` with the block's shell variables (``S="..."``, ``for m in a b``: the first value) filled in."""
    env = dict(re.findall(r'^\s*(\w+)="([^"]*)"', block, flags=re.M))
    env.update((k, v.split()[0]) for k, v in re.findall(r"for (\w+) in ([^;]+);", block))
    return re.sub(r"\$(\w+)", lambda m: env[m.group(1)], line)


def documented_torchrun_lines():
    """``[(where, argv after 'torchrun'), ...]`` for every torchrun command in a code block (commented ones too)."""
    out = []
    for path in DOCS:
        for block in _blocks(path.read_text()):
            logical = re.sub(r"\\\n\s*", " ", block).splitlines()
            for line in logical:
                cmd = line.strip().lstrip("#").strip()
                if not cmd.startswith("torchrun "):
                    continue
                argv = shlex.split(_expand(cmd, block), comments=True)
                out.append((f"{path.name}: {cmd[:60]}", argv[1:]))
    return out


LINES = documented_torchrun_lines()


def test_the_docs_have_torchrun_lines():
    names = {where.split(":")[0] for where, _ in LINES}
    assert {"README.md", "training.md", "reproduce.md", "language-model.md", "segmentation.md"} <= names
    assert any("--resume" in argv for _, argv in LINES)


@pytest.mark.parametrize("argv", [a for _, a in LINES], ids=[w for w, _ in LINES])
def test_documented_torchrun_line_parses_in_torchrun_and_in_our_cli(argv, capsys):
    from torch.distributed.run import get_args_parser

    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"torchrun rejects the documented line: {capsys.readouterr().err.strip()}")
    assert args.module and args.training_script == "rpc_attention"
    ours = build_parser().parse_args(args.training_script_args)
    assert ours.command in ("train", "reproduce")
    if ours.command == "train":
        from rpc_attention.cli.train import _run_dirs

        new, resume = _run_dirs(ours)
        assert (new or resume), "the line names no run directory"


def _line(doc, *needles):
    (argv,) = [a for w, a in LINES if w.startswith(doc) and all(n in a for n in needles)]
    return argv


def _torchrun():
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


SMALL = ["--set", "data.train_subset=128", "--set", "data.val_size=64", "--set", "data.test_subset=64",
         "--set", "model.kwargs.depth=1", "--set", "train.log_every=1", "--set", "eval.batch_size=64"]


@pytest.mark.xdist_group("train-subprocess")
def test_documented_cpu_torchrun_line_trains_and_its_resume_line_continues(tmp_path):
    env = dict(os.environ, RPC_ATTENTION_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    # the 2-process gloo line exactly as documented, with small-data settings appended
    train = _line("training.md", "--nproc_per_node=2", "fmnist-symvit")
    res = subprocess.run(_torchrun() + train + SMALL + ["--set", "train.max_steps=2"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = Path(train[train.index("--out") + 1])
    assert (tmp_path / run_dir / "model.safetensors").is_file()
    assert res.stdout.count("run saved in") == 1  # rank 0 speaks, rank 1 does not
    # the documented resume line, on 2 processes and this run's directory, two steps further
    resume = _line("training.md", "--resume")
    resume = [("--nproc_per_node=2" if a.startswith("--nproc_per_node") else a) for a in resume]
    resume[resume.index("--resume") + 1] = str(run_dir)
    res = subprocess.run(_torchrun() + resume + ["--set", "train.max_steps=4"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("run saved in") == 1
    import json

    steps = [json.loads(l)["step"] for l in (tmp_path / run_dir / "metrics.jsonl").read_text().splitlines()
             if json.loads(l).get("split") == "train"]
    assert steps == [1, 2, 3, 4]


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(tmp_path, env, program):
    """The documented two-machine line as two nodes of one process each on this machine: two torchrun
    agents, ``--nnodes 2 --node-rank 0/1``, their c10d rendezvous on 127.0.0.1 at a free port (node 0
    hosts the rendezvous store)."""
    line = _line("training.md", "--nnodes=2")
    launcher = line[:line.index("-m")]
    endpoint = f"127.0.0.1:{_free_port()}"
    launcher = [("--nproc_per_node=1" if a.startswith("--nproc_per_node") else
                 f"--rdzv-endpoint={endpoint}" if a.startswith("--rdzv-endpoint") else a) for a in launcher]
    procs = [subprocess.Popen(_torchrun() + launcher + ["--node-rank", str(rank), "--rdzv-conf", f"is_host={rank == 0}",
                                                        "-m", "rpc_attention", *program],
                              cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return "".join(o for o, _ in outs)


@pytest.mark.slow
@pytest.mark.xdist_group("train-subprocess")
def test_documented_two_node_line_as_two_nodes_on_this_machine_agrees_with_one_node_of_two(tmp_path):
    """Two nodes of one process and one node of two processes train and resume to the same weights,
    exactly: both are world size 2 with the same rank per data shard and RNG stream, and gloo's
    allreduce of two ranks adds two numbers per element (a + b, which does not depend on the order)."""
    import json

    from safetensors.torch import load_file

    env = dict(os.environ, RPC_ATTENTION_NO_PROGRESS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    cpu = _line("training.md", "--nproc_per_node=2", "fmnist-symvit")
    program = cpu[cpu.index("rpc_attention") + 1:]
    runs = {}
    for layout in ("two-nodes", "one-node"):
        out = f"runs/{layout}"
        train = [("runs/" + layout if a == "runs/ddp" else a) for a in program] + SMALL
        resume = ["train", "--resume", out]
        for argv in (train + ["--set", "train.max_steps=2"], resume + ["--set", "train.max_steps=4"]):
            if layout == "two-nodes":
                text = _two_nodes(tmp_path, env, argv)
            else:
                res = subprocess.run(_torchrun() + cpu[:cpu.index("-m")] + ["-m", "rpc_attention", *argv], cwd=tmp_path,
                                     env=env, capture_output=True, text=True, timeout=600)
                assert res.returncode == 0, res.stderr[-3000:]
                text = res.stdout
            assert text.count("run saved in") == 1  # global rank 0 alone writes
        run = tmp_path / out
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        runs[layout] = {"weights": load_file(run / "model.safetensors"),
                        "loss": [(m["step"], m["loss"]) for m in metrics if m.get("split") == "train"]}
        assert [s for s, _ in runs[layout]["loss"]] == [1, 2, 3, 4]
    a, b = runs["two-nodes"], runs["one-node"]
    assert a["loss"] == b["loss"]
    assert a["weights"].keys() == b["weights"].keys()
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
