"""Every command asked for a device this machine lacks answers in one line, exit 2 (cli.check_device)."""

import pytest
import torch

from rpc_attention.cli import UserError, check_device, main


def _missing_cuda() -> str:
    """A CUDA device this machine does not have."""
    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("argv", [
    ["train", "--preset", "fmnist-vit", "--out", "{tmp}/r"],
    ["eval", "--run", "{tmp}"],
    ["eval-external", "--run", "{tmp}", "--rpc-layers", "0"],
    ["analyze", "--run", "{tmp}", "--out", "{tmp}/a"],
    ["generate", "--run", "{tmp}", "--prompt", "the"],
    ["reproduce", "--study", "smoke", "--out", "{tmp}/s"],
    ["bench", "--smoke"],
])
def test_a_missing_device_is_one_line_exit_2(argv, tmp_path, capsys):
    rc = main([a.format(tmp=tmp_path) for a in argv] + ["--device", _missing_cuda()])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--device cuda" in err and "device" in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()  # nothing was started


def test_check_device():
    check_device(None)
    check_device("auto")
    check_device("cpu")
    with pytest.raises(UserError, match="not a torch device"):
        check_device("gpu0")
    with pytest.raises(UserError, match="this machine has"):
        check_device(_missing_cuda())
