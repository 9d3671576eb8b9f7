"""Make a fresh virtual environment that holds torch and nothing else, as a user's venv does after
``pip install torch``: the distributions of torch's requirement closure are hard-linked from the
development venv (seconds, no download, and a later ``pip uninstall`` there unlinks only the copy).

    python tests/wheel/bare_venv.py DEST      # DEST must not exist

The wheel check (``make test-wheel``) installs the built wheel into it and counts what pip adds.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement


def closure(root: str) -> dict:
    """``{normalised name: Distribution}`` for ``root`` and everything it requires on this platform,
    extras included where a requirement asks for them."""
    seen: dict = {}
    todo = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = name.lower().replace("_", "-")
        dist = md.distribution(name)
        known = seen.get(key)
        if known is not None and extras <= known[1]:
            continue
        seen[key] = (dist, extras | (known[1] if known else frozenset()))
        for text in dist.requires or []:
            req = Requirement(text)
            wanted = [""] + sorted(extras)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in wanted):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return {k: d for k, (d, _) in seen.items()}


def link_distribution(dist: md.Distribution, site: Path) -> int:
    """Hard-link every file the distribution's RECORD lists under site-packages into ``site``."""
    src_site = Path(dist.locate_file("")).resolve()
    n = 0
    for f in dist.files or []:
        src = Path(dist.locate_file(f)).resolve()
        try:
            rel = src.relative_to(src_site)
        except ValueError:
            continue  # a script in bin/: not needed to import torch
        if not src.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)  # another file system
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--root", default="torch", help="the distribution whose closure is installed (torch)")
    args = ap.parse_args(argv)
    if args.dest.exists():
        ap.error(f"{args.dest} exists: give a new folder")
    subprocess.run([sys.executable, "-m", "venv", str(args.dest)], check=True)
    py = args.dest / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    assert site != Path(sysconfig.get_path("purelib")), "the new venv must not share site-packages"
    dists = closure(args.root)
    files = sum(link_distribution(d, site) for d in dists.values())
    print(f"{args.dest}: {len(dists)} distributions of {args.root}'s closure ({files} files linked)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
