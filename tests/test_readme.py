"""README.md runs as written: its ``bash`` and ``python`` blocks are executed in order in one temporary
directory (shell blocks with ``bash -e``, Python blocks with this interpreter), with the small settings
they show. A block that needs a GPU, a cluster or external data is marked with an HTML comment
``<!-- not-run: why -->`` just before it and skipped; there may be only a few of those."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FMNIST = os.environ.get("RPC_ATTENTION_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
MAX_SKIPPED = 3

_BLOCK = re.compile(r"(?:<!--\s*not-run:(?P<why>[^>]*)-->\s*\n)?^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)


def readme_blocks(text: str):
    """``[(language, body, not-run reason or None), ...]`` of every fenced block, in order."""
    return [(m["lang"], m["body"], m["why"].strip() if m["why"] is not None else None)
            for m in _BLOCK.finditer(text)]


def test_block_parser_reads_markers_and_languages():
    text = ("intro\n<!-- not-run: needs ImageNet -->\n```bash\ntorchrun x\n```\n\n```python\nprint(1)\n```\n"
            "```\nplain\n```\n")
    assert readme_blocks(text) == [("bash", "torchrun x\n", "needs ImageNet"), ("python", "print(1)\n", None),
                                   ("", "plain\n", None)]


def test_readme_is_short_and_every_skipped_block_says_why():
    text = README.read_text()
    assert len(text.splitlines()) <= 250  # a user's first page: the result tables are in the docs
    blocks = readme_blocks(text)
    assert all(lang in ("bash", "python") for lang, _, _ in blocks), "README code blocks are bash or python"
    skipped = [why for _, _, why in blocks if why is not None]
    assert all(skipped) and len(skipped) <= MAX_SKIPPED, skipped
    assert text.splitlines()[4:6] == [
        "make demo   # creates .venv, installs everything, runs the main job (the `quick` study) on the embedded default data",
        "make test   # creates .venv if needed, installs with the dev extras, runs the test suite"]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FMNIST), reason="Fashion-MNIST not installed")
def test_readme_blocks_run_in_order(tmp_path):
    # RPC_ATTENTION_TEST_VENV: run the blocks with another venv's python and rpc-attention, the package
    # as installed there (tests/wheel/check_wheel.py --all); by default this checkout's source
    venv = os.environ.get("RPC_ATTENTION_TEST_VENV")
    python = str(Path(venv) / "bin" / "python") if venv else sys.executable
    env = dict(os.environ, PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]),
               MPLBACKEND="Agg", RPC_ATTENTION_NO_PROGRESS="1", HF_HUB_OFFLINE="1")
    if not venv:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    ran, printed = 0, []
    for i, (lang, body, why) in enumerate(readme_blocks(README.read_text())):
        if why is not None:
            continue
        cmd = ["bash", "-e", "-o", "pipefail", "-c", body] if lang == "bash" else [python, "-c", body]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"README block {i} ({lang}) failed:\n{body}\n--- stderr:\n{proc.stderr[-3000:]}"
        assert "Traceback" not in proc.stderr, f"README block {i} printed a traceback:\n{proc.stderr[-3000:]}"
        ran += 1
        printed.append(proc.stdout)
    assert ran >= 8
    check_quoted_numbers(README.read_text(), "\n".join(printed))


def check_quoted_numbers(text: str, printed: str) -> None:
    """The numbers the README quotes as "about" are what its blocks printed, within 0.01 (their last digits
    follow the CPU's float32 kernels)."""
    quoted = re.search(r"`optimal_cosine` about\s+(\S+) against a chance level of about (\S+) and `jproj` about (\S+) =",
                       text)
    assert quoted, "the README quotes the analyze line's optimal_cosine, chance level and jproj"
    # the quoted line is the last analyze block's (the random ViT-tiny), after the trained run's
    exact = re.findall(r"\[exact\] optimal_cosine=(\S+),.* jproj=(\S+?),", printed)
    chance = re.findall(r'chance: \{.*?"optimal_cosine": (\S+?)[,}]', printed)
    assert exact and chance, printed[-2000:]
    for said, got in zip(quoted.groups(), (exact[-1][0], chance[-1], exact[-1][1])):
        assert abs(float(said) - float(got)) <= 0.01, (said, got)


def test_quoted_numbers_are_held_to_what_was_printed():
    text = ("prints `optimal_cosine` about\n0.31 against a chance level of about 0.32 and `jproj` about -0.11 = x")
    out = ('[exact] optimal_cosine=0.3138, linear_cka=0.4, rbf_cka=0.5, jproj=-0.114, phi2=4e-05\n'
           'chance: {"197x64": {"direct_cosine": -0.0043, "optimal_cosine": 0.3163, "linear_cka": 0.2}}')
    check_quoted_numbers(text, out)
    earlier = '[exact] optimal_cosine=0.2898, jproj=-0.3, x\nchance: {"a": {"optimal_cosine": 0.5}}\n'
    check_quoted_numbers(text, earlier + out)  # the last analyze block's numbers are the quoted ones
    with pytest.raises(AssertionError):
        check_quoted_numbers(text, out.replace("jproj=-0.114", "jproj=-0.157"))
