"""ruff's linter over the sources and tests, with the rules pyproject.toml states ([tool.ruff]).

The layout is not `ruff format`'s: the code keeps hanging indents with several arguments per line, on
which the 60-line function limit (tests/test_architecture.py) is measured."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(exe).is_file():
        pytest.skip("ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")
    return [exe]


def test_ruff_check_passes():
    out = subprocess.run(_ruff() + ["check", "--no-cache", "src", "tests"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]

