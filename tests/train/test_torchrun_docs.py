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
