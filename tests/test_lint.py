"""ruff over the sources and tests, with the rules pyproject.toml states ([tool.ruff])."""

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


def test_ruff_format_check_passes():
    """The tree is laid out as `ruff format` lays it out (line length 120, pyproject.toml)."""
    out = subprocess.run(_ruff() + ["format", "--check", "--no-cache", "src", "tests"], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
