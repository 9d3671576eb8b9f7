"""The package's structure: the floors contract (import-linter), explicit wiring (no import hooks, no
discovery of modules by file name, no monkeypatching: an AST scan of src/) and explicit registration."""

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rpc_attention"

# The exceptions, each needed for a library this package works with:
# - evaluate/_imagecorruptions_compat.py lets the third-party imagecorruptions 1.1.2 run on NumPy 2 /
#   scikit-image >= 0.25 / setuptools without pkg_resources: it imports that library by name, puts a stand-in
#   pkg_resources in sys.modules while the import runs, and swaps three names inside imagecorruptions' own
#   namespace while a corruption runs, restoring them afterwards.
# - integrations/transformers.py: transformers has no hook at model creation for a custom attention backend,
#   and bad rpc_* settings must fail when a model is created, not at its first forward. The explicit
#   rpc_hf.register() call wraps PreTrainedModel.post_init / set_attn_implementation to run
#   rpc_hf.prepare(model) for models that use "rpc"; rpc_hf.unregister() restores both.
# - integrations/timm.py: convert(model) changes a timm attention module in place, keeping the module object,
#   its parameters and state-dict keys (so optimisers, hooks and checkpoints still refer to it), by swapping
#   its __class__ for RPCAttention or a subclass whose forward routes SDPA through RPC; revert() swaps back.
# - extras.py: import_optional(name) imports an optional third-party package by name (only the packages of
#   its PROVIDERS table; it refuses any other name), to turn its absence into the one-line install message.
ALLOWED = {"evaluate/_imagecorruptions_compat.py": {"dynamic-import", "sys-modules", "monkeypatch"},
           "extras.py": {"dynamic-import"},
           "integrations/transformers.py": {"monkeypatch"},
           "integrations/timm.py": {"class-swap"}}


def test_floors_contract_is_kept():
    """`lint-imports` with the contracts in pyproject.toml: no package imports a higher floor, no cycles."""
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, "-c", code, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                         capture_output=True, text=True, cwd=ROOT, env=env)
    assert "No module named 'importlinter'" not in out.stderr, "install the dev extra: pip install -e '.[dev]'"
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "2 kept, 0 broken" in out.stdout


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _module_names(tree: ast.Module, package: List[str]) -> Set[str]:
    """Names bound to other modules or to what they define: ``import x [as y]``, ``from <another
    package> import <anything>``, ``from <this package> import <submodule>`` and
    ``m = importlib.import_module(...)``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module.split(".")[0] != package[0]:
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            for a in node.names:
                folder = SRC.joinpath(*base[1:], a.name)
                if folder.with_suffix(".py").is_file() or (folder / "__init__.py").is_file():
                    names.add(a.asname or a.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            if _dotted(node.value.func) in ("importlib.import_module", "__import__"):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def wiring_findings(source: str, package: List[str] = ("rpc_attention",)) -> List[Tuple[str, int]]:
    """``(kind, line)`` of every import hook, file-name discovery, dynamic import and monkeypatch."""
    tree = ast.parse(source)
    modules = _module_names(tree, list(package))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _dotted(node) in ("sys.meta_path", "sys.path_hooks"):
            found.append(("import-hook", node.lineno))
        elif isinstance(node, ast.Attribute) and _dotted(node).startswith("importlib.abc"):
            found.append(("import-hook", node.lineno))
        elif isinstance(node, ast.Attribute) and node.attr == "exec_module" and isinstance(node.ctx, ast.Store):
            found.append(("import-hook", node.lineno))
        elif isinstance(node, ast.Call):
            func = _dotted(node.func)
            if func.startswith("pkgutil.") or func.endswith(("iter_modules", "walk_packages")):
                found.append(("module-discovery", node.lineno))
            elif func in ("importlib.import_module", "__import__"):
                found.append(("dynamic-import", node.lineno))
            elif func.endswith("glob") and any(isinstance(a, ast.Constant) and ".py" in str(a.value).replace(".pyc", "")
                                               and not str(a.value).endswith((".yaml", ".pyi")) for a in node.args):
                found.append(("module-discovery", node.lineno))
            elif func == "setattr" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value == "__class__":
                found.append(("class-swap", node.lineno))
            elif func == "setattr" and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in modules:
                found.append(("monkeypatch", node.lineno))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "__class__":
                    found.append(("class-swap", node.lineno))
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules:
                    found.append(("monkeypatch", node.lineno))
                if isinstance(t, ast.Subscript) and _dotted(t.value) == "sys.modules":
                    found.append(("sys-modules", node.lineno))
    return found


@pytest.mark.parametrize("snippet,kind", [
    ("import sys\nsys.meta_path.insert(0, object())", "import-hook"),
    ("import importlib.abc\nclass F(importlib.abc.MetaPathFinder): pass", "import-hook"),
    ("def f(spec):\n    spec.loader.exec_module = print", "import-hook"),
    ("import pkgutil\nnames = [m.name for m in pkgutil.iter_modules(__path__)]", "module-discovery"),
    ("from pathlib import Path\nmods = Path(__file__).parent.glob('task_*.py')", "module-discovery"),
    ("import importlib\nm = importlib.import_module('rpc_attention.train.task_lm')", "dynamic-import"),
    ("from . import eval as base\nbase.load_model = print", "monkeypatch"),
    ("import torch\nsetattr(torch, 'compile', print)", "monkeypatch"),
    ("from transformers import PreTrainedModel\nsetattr(PreTrainedModel, 'post_init', print)", "monkeypatch"),
    ("def f():\n    from torch.nn import Linear\n    Linear.forward = print", "monkeypatch"),
    ("import sys, types\nsys.modules['pkg_resources'] = types.ModuleType('pkg_resources')", "sys-modules"),
    ("def f(m, cls):\n    m.__class__ = cls", "class-swap"),
    ("def f(m, cls):\n    setattr(m, '__class__', cls)", "class-swap"),
])
def test_scanner_flags_each_kind(snippet, kind):
    assert kind in [k for k, _ in wiring_findings(snippet, ["rpc_attention", "cli"])]


def test_scanner_leaves_ordinary_code_alone():
    code = ("import torch\nfrom torch import nn\nm = nn.Linear(2, 2)\nm.weight = nn.Parameter(torch.zeros(2, 2))\n"
            "setattr(m, 'bias', None)\nfrom pathlib import Path\npresets = Path('.').glob('*.yaml')\n")
    assert wiring_findings(code) == []


def test_exactly_the_two_integration_patches_are_allowed():
    """The HF integration wraps PreTrainedModel's methods, the timm one swaps module classes; nothing else in
    the package patches a library or an object's class (docs/architecture.md says why each is needed)."""
    found = {}
    for rel in ("integrations/transformers.py", "integrations/timm.py"):
        found[rel] = {k for k, _ in wiring_findings((SRC / rel).read_text(encoding="utf-8"),
                                                    ["rpc_attention", "integrations"])}
    assert found == {"integrations/transformers.py": {"monkeypatch"}, "integrations/timm.py": {"class-swap"}}
    patches = {rel for rel, kinds in ALLOWED.items() if kinds & {"monkeypatch", "class-swap"}}
    assert patches - {"evaluate/_imagecorruptions_compat.py"} == {"integrations/transformers.py",
                                                                  "integrations/timm.py"}


def test_src_has_no_import_hooks_discovery_or_monkeypatching():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        package = ["rpc_attention"] + list(path.relative_to(SRC).parent.parts)
        for kind, line in wiring_findings(path.read_text(encoding="utf-8"), package):
            if kind not in ALLOWED.get(rel, ()):
                problems.append(f"{rel}:{line}: {kind}")
    assert not problems, "\n".join(problems)


def _run(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout


def test_registries_are_filled_by_explicit_imports():
    """Tasks and suites come from the listed built-in modules; the trainer's own callback (sparsity) is built
    in and jproj comes from an explicit kpca.register_callbacks() call; the CLI lists its commands. A trainer
    config naming jproj before that call says how to fix it; importing kpca registers nothing."""
    out = _run(
        "from rpc_attention.train import callbacks, tasks\n"
        "from rpc_attention.evaluate import suites\n"
        "from rpc_attention.cli import commands\n"
        "print(tasks.list_tasks())\n"
        "print(all(n in suites.list_suites() for n in ('clean', 'pgd', 'corruptions', 'ood', 'ppl', 'seg')))\n"
        "import rpc_attention.kpca\n"
        "try:\n    callbacks.get_callback('jproj')\nexcept ValueError as e:\n    print(e)\n"
        "rpc_attention.kpca.register_callbacks()\nprint(callbacks.list_callbacks())\n"
        "print([n for n, _ in commands()])\n")
    lines = out.splitlines()
    assert lines[0] == "['classification', 'lm', 'segmentation']"
    assert lines[1] == "True"
    assert "unknown callback 'jproj'" in lines[2] and "rpc_attention.kpca.register_callbacks()" in lines[2]
    assert lines[3] == "['jproj', 'sparsity']"
    assert lines[4] == str(["analyze", "bench", "compare", "eval", "eval-external", "generate", "pap-demo", "plan",
                            "presets", "publish", "reproduce", "robustness", "train", "verify"])


def test_a_failed_builtin_registration_leaves_the_registry_unflagged_and_a_retry_fills_it():
    """The task registry imports its built-in modules first and sets its flag last: while an import fails,
    no task is registered and the flag stays down; once the import works, the next lookup fills it."""
    out = _run(
        "import builtins, sys\n"
        "from rpc_attention.train import tasks\n"
        "real = builtins.__import__\n"
        "def failing(name, globals=None, locals=None, fromlist=(), level=0):\n"
        "    if 'task_lm' in (fromlist or ()) or name.endswith('task_lm'):\n"
        "        raise ImportError('task_lm is broken')\n"
        "    return real(name, globals, locals, fromlist, level)\n"
        "builtins.__import__ = failing\n"
        "try:\n    tasks.list_tasks()\nexcept ImportError as e:\n    print('failed:', e)\n"
        "builtins.__import__ = real\n"
        "print(sorted(tasks._TASKS), tasks._BUILTINS_REGISTERED)\n"
        "print(tasks.list_tasks(), tasks._BUILTINS_REGISTERED)\n")
    lines = out.splitlines()
    assert lines[0] == "failed: task_lm is broken"
    assert lines[1] == "[] False"
    assert lines[2] == "['classification', 'lm', 'segmentation'] True"


# --- function and module length -------------------------------------------------------------
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 650  # outside models/, where a family's blocks, model and entry points stay together
# Functions and modules allowed to be longer, each with its reason.
LONG_FUNCTIONS_ALLOWED: Dict[str, str] = {}
LONG_MODULES_ALLOWED: Dict[str, str] = {}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> List[Tuple[str, int]]:
    """``(name, lines)`` of every function or method in ``source`` longer than ``limit`` lines
    (from the ``def`` line to its last line, docstring included, decorators not)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.name, length))
    return found


def test_long_function_finder_counts_lines():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions("def f():\n" + body) == []  # 60 lines
    assert long_functions("class A:\n    def g(self):\n" + "    " + body.replace("\n", "\n    ") + "y = 1\n") == []
    assert long_functions("def f():\n" + body + "    return 0\n") == [("f", 61)]


def test_no_function_in_src_is_over_60_lines():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for name, length in long_functions(path.read_text(encoding="utf-8")):
            if f"{rel}::{name}" not in LONG_FUNCTIONS_ALLOWED:
                too_long.append(f"{rel}::{name} ({length} lines)")
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {too_long}"


def test_no_module_outside_models_is_over_650_lines():
    too_long = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES and not rel.startswith("models/") and rel not in LONG_MODULES_ALLOWED:
            too_long.append(f"{rel} ({lines} lines)")
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {too_long}"


def test_the_allow_lists_name_only_what_is_still_long():
    """An entry whose function or module got short again is taken off its list."""
    stale = []
    for entry in LONG_FUNCTIONS_ALLOWED:
        rel, name = entry.split("::")
        path = SRC / rel
        if not path.is_file() or name not in [n for n, _ in long_functions(path.read_text(encoding="utf-8"))]:
            stale.append(entry)
    for rel in LONG_MODULES_ALLOWED:
        path = SRC / rel
        if not path.is_file() or len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES:
            stale.append(rel)
    assert not stale, f"no longer too long, remove from the allow-lists: {stale}"


def test_the_docs_floor_table_is_the_import_linter_contract():
    """docs/architecture.md's floor table names the contract's layers, top to bottom, as pyproject.toml has them."""
    import re

    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "floors")["layers"]
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| floor (top to bottom) | owns |"):].split("\n\n", 1)[0].splitlines()[2:]
    floors = [" | ".join(re.findall(r"`([a-z_]+)`", row.split(" | ", 1)[0])) for row in table]
    assert floors == [" | ".join(p.strip() for p in layer.split("|")) for layer in layers]
