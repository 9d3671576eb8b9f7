"""The package's metadata and its optional dependencies: pyproject.toml's extras and
``rpc_attention.extras`` say the same thing; every optional package the code imports is declared; a
missing extra gives one line with the install command, from Python and from the command line; one
version source. (The built wheel in a torch-only venv: ``make test-wheel``, tests/wheel/check_wheel.py.)"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import rpc_attention
from rpc_attention import extras
from rpc_attention.cli import main

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _declared(extra: str) -> set:
    """The distributions ``extra`` declares, its included ``rpc-attention[...]`` extras expanded."""
    out = set()
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        if _name(req) == "rpc-attention":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):
                out |= _declared(inner.strip())
        else:
            out.add(_name(req))
    return out


def _dist(module: str) -> str:
    return extras.PROVIDERS[module][0].lower().replace("_", "-")


@pytest.mark.parametrize("extra", [e for e in extras.EXTRAS])
def test_each_extra_declares_what_the_table_says(extra):
    assert _declared(extra) == {_dist(m) for m in extras.modules_of(extra)}


def test_every_provider_sits_in_its_extra_and_the_core_is_torch_and_numpy():
    assert sorted(_name(r) for r in PYPROJECT["project"]["dependencies"]) == ["numpy", "torch"]
    for module, (dist, extra) in extras.PROVIDERS.items():
        assert module in extras.modules_of(extra), (module, extra)
        assert dist.lower() in _declared(extra)
    assert set(PYPROJECT["project"]["optional-dependencies"]) == set(extras.EXTRAS) | {"dev"}


def _third_party_imports() -> set:
    std = set(sys.stdlib_module_names)
    found = set()
    for path in (ROOT / "src" / "rpc_attention").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {n.split(".")[0] for n in names} - std - {"rpc_attention"}
    return found


def test_every_package_the_code_imports_is_the_core_or_has_an_extra():
    # packaging comes with transformers, which imports it itself; cv2 is imagecorruptions' own import
    assert _third_party_imports() - {"torch", "numpy", "packaging"} <= set(extras.PROVIDERS)


def test_require_names_the_missing_packages_and_the_command():
    with pytest.raises(extras.MissingExtraError) as err:
        extras.require("rpc_attention.demo", "timm", modules=["timm", "no_such_module_xyz"])
    msg = str(err.value)
    assert msg == ("rpc_attention.demo needs no_such_module_xyz, which is not installed: "
                   "pip install 'rpc-attention[timm]'")
    assert "\n" not in msg and isinstance(err.value, ModuleNotFoundError) and err.value.modules == ["no_such_module_xyz"]
    extras.require("rpc_attention.demo", "timm")  # installed here: no error
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        extras.require("x", "nope")


def test_import_optional_maps_a_missing_provider_to_its_extra(monkeypatch):
    real = extras.importlib.import_module

    def fake(name, *a):
        if name.split(".")[0] == "torchattacks":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a)

    monkeypatch.setattr(extras.importlib, "import_module", fake)
    with pytest.raises(extras.MissingExtraError, match=r"^rpc_attention.evaluate.attacks needs torchattacks, which is not installed: "
                                                         r"pip install 'rpc-attention\[eval\]'$"):
        extras.import_optional("torchattacks", "rpc_attention.evaluate.attacks")
    with pytest.raises(ValueError, match="optional packages of PROVIDERS only"):
        extras.import_optional("rpc_attention.train")


def test_cli_turns_a_missing_optional_module_into_one_line_with_the_commands_extra(monkeypatch, capsys):
    import rpc_attention.cli.presets as presets

    def run(args):
        raise ModuleNotFoundError("No module named 'yaml'", name="yaml")

    monkeypatch.setattr(presets, "run", run)
    assert main(["presets"]) == 2
    err = capsys.readouterr().err
    assert err == ("rpc-attention presets: error: this command needs pyyaml, which is not installed: "
                   "pip install 'rpc-attention[train]'\n")

    def bug(args):
        raise ModuleNotFoundError("No module named 'no_such_module_xyz'", name="no_such_module_xyz")

    monkeypatch.setattr(presets, "run", bug)
    with pytest.raises(ModuleNotFoundError):  # a missing module that no extra provides is a bug: it propagates
        main(["presets"])


def test_every_command_names_its_extra():
    from rpc_attention.cli import commands

    for name, module in commands():
        assert module.EXTRA is None or module.EXTRA in extras.EXTRAS, name


def test_a_package_guard_blocks_its_import_with_one_line(tmp_path):
    # a stand-in 'timm' that cannot be found: a meta-path finder refusing it, in a fresh interpreter
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('timm', 'torchvision'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import rpc_attention\n"
            "import rpc_attention.models\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "rpc_attention.extras.MissingExtraError: rpc_attention.models needs timm, torchvision, which are not "
        "installed: pip install 'rpc-attention[timm]'")


def test_one_version_source():
    assert rpc_attention.__version__ == md.version("rpc-attention") == PYPROJECT["project"]["version"]
    assert (ROOT / "src" / "rpc_attention" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["rpc_attention"]


def test_the_data_packages_have_one_pin_everywhere():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "tests" / "wheel" / "check_wheel.py")
    check_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_wheel)
    makefile = (ROOT / "Makefile").read_text()
    docs = (ROOT / "docs" / "installation.md").read_text()
    for pin in check_wheel.DATA_PACKAGES:
        assert pin in makefile and pin in docs, pin
