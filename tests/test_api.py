"""The public API: which modules list names (``__all__``), what the top packages list, and that no module of
the package imports another module's private names (a new model family needs none)."""

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "rpc_attention"

# The modules with a public list: the packages, the user-facing modules (the attention layers, the optional
# extras, the file and table helpers, the S-activity probe) and every module of the packages a user imports
# whole (the kernels, the model families, the integrations, the kernel-PCA toolkit). Everything else is
# reached through them.
WHOLE_PACKAGES = ("functional", "models", "integrations", "kpca")


def _public_submodules(package: str) -> set:
    """``rpc_attention.<package>.<module>`` for each module of the package whose name has no leading
    underscore (pkgutil reads the directory; nothing is imported)."""
    return {f"rpc_attention.{package}.{info.name}" for info in pkgutil.iter_modules([str(SRC / package)])
            if not info.name.startswith("_")}


PUBLIC_MODULES = {
    "rpc_attention", "rpc_attention.nn", "rpc_attention.extras", "rpc_attention.files", "rpc_attention.markdown",
    "rpc_attention.overrides", "rpc_attention.data", "rpc_attention.train", "rpc_attention.train.sparsity",
    "rpc_attention.evaluate", "rpc_attention.report", "rpc_attention.reproduce", "rpc_attention.bench",
    *(f"rpc_attention.{p}" for p in WHOLE_PACKAGES),
    *(m for p in WHOLE_PACKAGES for m in _public_submodules(p)),
}
# Modules that still carry a list of their own; this set only shrinks.
STILL_LISTING = {
    "rpc_attention.data.images", "rpc_attention.train.config",
    *(f"rpc_attention.evaluate.{m}" for m in ("_imagecorruptions_compat", "attacks", "corruptions", "external",
                                              "inputs", "lm", "ood", "per_example", "predict", "runner",
                                              "segmentation", "sparse", "suites")),
    *(f"rpc_attention.report.{m}" for m in ("collect", "compare", "figures", "intervals", "lead", "render",
                                            "sparsity", "verdict")),
    *(f"rpc_attention.reproduce.{m}" for m in ("pipeline", "stages", "studies")),
}


def _module_name(path: Path) -> str:
    parts = ["rpc_attention"] + list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declares_all(path: Path) -> bool:
    return any((isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
               or (isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "__all__")
               for n in ast.parse(path.read_text(encoding="utf-8")).body)


def test_only_the_public_modules_list_names():
    listing = {_module_name(p) for p in SRC.rglob("*.py") if _declares_all(p)}
    assert listing - PUBLIC_MODULES - STILL_LISTING == set(), "a module outside the public API declares __all__"
    assert PUBLIC_MODULES <= listing, f"public modules without __all__: {sorted(PUBLIC_MODULES - listing)}"


def test_the_top_level_api():
    import rpc_attention
    import rpc_attention.functional as RF

    assert rpc_attention.__all__ == ["functional", "nn", "pap_attention", "symmetric_attention", "scaled_attention_s",
                                     "scaled_attention_alpha", "Attention", "SymmetricAttention", "RPCAttention",
                                     "ScaledAttention", "__version__"]
    assert sorted(RF.__all__) == sorted(["PAPState", "THRESHOLDS", "MU_MODES", "as_bool_mask", "attention",
                                         "symmetric_attention", "pap_attention", "pap_decompose", "scaled_attention_s",
                                         "scaled_attention_alpha", "soft_shrink", "sparse_activity",
                                         "check_pap_options", "PAPCache", "pap_prefill", "append_rows", "LOWRANKS", "SHRINKS",
                                         "hard_shrink", "robust_scale", "KEY_CONTROLS", "KEY_CONTROL_LEVELS",
                                         "check_key_control", "clip_keys", "key_drop_mask", "controlled_keys",
                                         "controlled_symmetric_attention"])
    # the plumbing behind pap_attention is not public, but stays importable from its module
    from rpc_attention.functional import pap

    for name in ("prepare_pap", "PAPProblem", "pap_loop", "sparse_term_activity"):
        assert name not in RF.__all__ and callable(getattr(pap, name))


def test_what_a_model_family_needs_is_public():
    import rpc_attention.models as models
    import rpc_attention.nn as rnn

    for name in ("build_timm_model", "feature_take_indices", "read_checkpoint", "unwrap_state_dict"):
        assert name in models.__all__
    assert "softmax_attention" in rnn.__all__


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_listed_name_exists_and_is_public(module):
    if module == "rpc_attention.integrations.transformers":
        pytest.importorskip("transformers")
    mod = importlib.import_module(module)
    names = list(mod.__all__)
    assert len(names) == len(set(names)), f"{module}.__all__ repeats a name"
    assert [n for n in names if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))] == []
    assert [n for n in names if not hasattr(mod, n)] == []
    assert all(isinstance(n, str) for n in names)


def test_the_whole_packages_are_walked():
    """The walk finds the modules (a renamed directory would otherwise make the test above vacuous)."""
    assert {"rpc_attention.functional.pap", "rpc_attention.models.vision", "rpc_attention.integrations.timm",
            "rpc_attention.kpca.metrics"} <= PUBLIC_MODULES
    assert "rpc_attention.integrations._core" not in PUBLIC_MODULES


def private_imports(source: str, module: str):
    """``(line, what)`` for each import of a ``_private`` name from another rpc_attention module, or of a
    ``_private`` module from outside its own package."""
    package = module.split(".") if module.endswith("__init__") else module.split(".")[:-1]
    package = [p for p in package if p != "__init__"]
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
        elif node.module and node.module.split(".")[0] == "rpc_attention":
            base = node.module.split(".")
        else:
            continue
        for alias in node.names:
            own_module = base == package and SRC.joinpath(*base[1:], alias.name + ".py").is_file()
            if alias.name.startswith("_") and not alias.name.startswith("__") and not own_module:
                found.append((node.lineno, ".".join(base + [alias.name])))
        for i, part in enumerate(base):
            if part.startswith("_") and not part.startswith("__") and base[:i] != package:
                found.append((node.lineno, ".".join(base[: i + 1])))
    return found


def test_private_import_finder():
    assert private_imports("from ..nn import _helper, Attention", "rpc_attention.models.fan") == [
        (1, "rpc_attention.nn._helper")]
    assert private_imports("from .vision import _unwrap", "rpc_attention.models.fan") == [
        (1, "rpc_attention.models.vision._unwrap")]
    assert private_imports("from ..integrations._core import check", "rpc_attention.evaluate.external") == [
        (1, "rpc_attention.integrations._core")]
    assert private_imports("from ._core import check", "rpc_attention.integrations.timm") == []  # its own package
    assert private_imports("from . import _core", "rpc_attention.integrations.timm") == []
    assert private_imports("from timm.models._features import f\nfrom . import nn", "rpc_attention.models.fan") == []


def test_no_module_imports_private_names_of_another():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(["rpc_attention"] + list(path.relative_to(SRC).with_suffix("").parts))
        problems += [f"{path.relative_to(SRC)}:{line}: {what}"
                     for line, what in private_imports(path.read_text(encoding="utf-8"), module)]
    assert problems == []


def test_the_fan_family_uses_no_private_names():
    """models/fan.py is written against public names only (ours and timm's), without its own torch.fx.wrap."""
    source = (SRC / "models" / "fan.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in modules if any(p.startswith("_") and p != "__future__" for p in m.split("."))]
    assert "torch.fx.wrap" not in source
