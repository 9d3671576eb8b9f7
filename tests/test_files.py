"""Atomic writers: the target is replaced whole or not at all."""

import json

import numpy as np
import pytest

from rpc_attention.files import atomic_savefig, atomic_write, atomic_write_json, atomic_write_text


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "result.json"
    atomic_write_json(path, {"acc": np.float32(0.5), "eps": np.arange(2), "where": tmp_path})
    before = path.read_text()
    assert json.loads(before) == {"acc": 0.5, "eps": [0, 1], "where": str(tmp_path)}

    def half_written(tmp):
        with open(tmp, "w") as f:
            f.write("{ half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        atomic_write(path, half_written)
    with pytest.raises(TypeError, match="not JSON serialisable"):
        atomic_write_json(path, {"x": object()})
    assert path.read_text() == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["result.json"]
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"


def test_savefig_writes_a_png(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1))
    path = atomic_savefig(fig, tmp_path / "f.png", dpi=20)
    plt.close(fig)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.png"]


def test_to_json_writes_standard_json_from_numpy_torch_fractions_and_paths(tmp_path):
    """The one JSON cleaning (results, suite records, kpca.json, compare.json): no NaN/Infinity tokens."""
    from fractions import Fraction

    import torch

    from rpc_attention.files import to_json

    obj = {"acc": np.float32(0.5), "n": np.int64(3), "nan": float("nan"), "inf": np.float64("inf"),
           "eps": Fraction(1, 4), "t": torch.tensor([[1.0, float("-inf")]]), "where": tmp_path, 7: ("a", {1.5})}
    want = {"acc": 0.5, "n": 3, "nan": None, "inf": None, "eps": 0.25, "t": [[1.0, None]], "where": str(tmp_path),
            "7": ["a", [1.5]]}
    assert to_json(obj) == want and type(to_json(obj)["n"]) is int
    path = tmp_path / "r.json"
    atomic_write_json(path, obj)

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    assert json.loads(path.read_text(), parse_constant=refuse) == want
    with pytest.raises(TypeError, match="not JSON serialisable: object"):
        to_json({"x": [object()]})
    assert to_json({"x": [object]}, default=lambda o: o.__name__) == {"x": ["object"]}


def test_written_files_get_the_mode_open_would_give(tmp_path):
    import os
    import stat

    from rpc_attention.files import atomic_write_text

    old = os.umask(0o027)
    try:
        new = atomic_write_text(tmp_path / "a.json", "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640   # 0666 less the umask, not mkstemp's 0600
        os.chmod(new, 0o604)
        atomic_write_text(new, "[]")                          # a rewrite keeps the file's own mode
        assert stat.S_IMODE(new.stat().st_mode) == 0o604 and new.read_text() == "[]"
    finally:
        os.umask(old)
