"""``rpc-attention publish``: put a finished study's numbers into the README and docs.

``publish runs/demo --as quick`` copies ``runs/demo/results.json`` to ``docs/results/quick.json`` and
re-renders every block marked ``<!-- results quick VIEW -->`` in ``README.md`` and ``docs/*.md``;
``publish --check`` exits 1 when a block's text is not what its published results render."""

from __future__ import annotations

import argparse

HELP = "copy a study's results into docs/results and regenerate the README's and docs' result blocks"
EXTRA = "report"  # the extra this command needs: pip install "rpc-attention[report]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study_dir", nargs="?", metavar="STUDY_DIR", help="a finished study directory (results.json)")
    parser.add_argument("--as", dest="name", metavar="NAME",
                        help="the name its blocks use (docs/results/NAME.json), e.g. quick, decide, lm-gap")
    parser.add_argument("--root", default=".", metavar="DIR", help="the repository (default: the current folder)")
    parser.add_argument("--check", action="store_true",
                        help="only check: list the blocks whose text differs from their results, exit 1 if any")
    parser.add_argument("--force", action="store_true", help="replace other published results under the same name")
    parser.add_argument("--relative-paths", action="store_true",
                        help="rewrite every docs/results/*.json with the paths under its study directory made "
                             "relative to it (publishing does this; for results published or merged before)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..report.publish import (
        PublishError,
        find_blocks,
        publish_results,
        relative_published_results,
        render_blocks,
        stale_blocks,
    )
    from . import UserError

    root = Path(args.root)
    if not (root / "README.md").is_file():
        raise UserError(f"{root} has no README.md: run it in the repository or give --root DIR")
    try:
        if args.relative_paths:
            if args.study_dir or args.name or args.check:
                raise UserError("--relative-paths takes no STUDY_DIR, --as or --check")
            changed = relative_published_results(root)
            print(f"{len(changed)} result file(s) rewritten with relative paths" +
                  (": " + ", ".join(str(p) for p in changed) if changed else ""))
            return 0
        if args.check:
            if args.study_dir or args.name:
                raise UserError("--check takes no STUDY_DIR or --as")
            stale = stale_blocks(root)
            for line in stale:
                print(f"stale: {line}")
            print(f"{len(find_blocks(root)) - len(stale)} result blocks current, {len(stale)} stale")
            return 1 if stale else 0
        if not args.study_dir:
            changed = render_blocks(root)
            print(f"re-rendered {len(changed)} file(s)" + (": " + ", ".join(str(p) for p in changed) if changed else ""))
            return 0
        if not args.name:
            raise UserError("give the name its blocks use: --as NAME")
        dest = publish_results(Path(args.study_dir), root, args.name, force=args.force)
    except PublishError as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {dest}; result blocks re-rendered")
    return 0
