"""``rpc-attention verify``: recompute every interval and verdict of published results from the files alone.

``verify docs/results/paper.json`` (or ``verify --all``, every file in ``docs/results``) recomputes each
claim from the results file and its per-example records (``NAME.examples.json.gz`` beside it) with the
report's own code, prints one line per claim and every number that differs, and exits 1 if any does; for a
pre-registered run it also checks the stage records against the plan: every stage started after the plan's
commit, and one code commit, with its files unchanged, ran them all.
``--write`` stores the recomputed claims instead (results published under an earlier rule)."""

from __future__ import annotations

import argparse

HELP = "recompute a published study's intervals and verdicts from its committed files; exit 1 on a difference"
EXTRA = "report"  # the extra this command needs: pip install "rpc-attention[report]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="*", metavar="RESULTS_JSON", help="published results files")
    parser.add_argument("--all", action="store_true", help="every docs/results/*.json under --root")
    parser.add_argument("--root", default=".", metavar="DIR", help="the repository (default: the current folder)")
    parser.add_argument("--write", action="store_true", help="store the recomputed claims in the files")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..report.recompute import verify_results
    from . import UserError

    paths = [Path(p) for p in args.results]
    if args.all:
        paths += sorted((Path(args.root) / "docs" / "results").glob("*.json"))
    if not paths:
        raise UserError("give results files, or --all")
    bad = 0
    for p in paths:
        if not p.is_file():
            raise UserError(f"{p}: no such results file")
        try:
            out = verify_results(p, write=args.write)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        source = "per-example records" if out["examples"] else "stored example intervals"
        print(f"{p}: {len(out['claims'])} claims recomputed from the per-seed values and {source}; "
              f"{len(out['differences'])} differences" + (" (written)" if args.write else ""))
        for cid, field, a, b in out["differences"]:
            print(f"  {cid}: {field} published {a!r}, recomputed {b!r}")
        for problem in out["provenance"]:
            print(f"  provenance: {problem}")
        bad += (bool(out["differences"]) and not args.write) or bool(out["provenance"])
    return 1 if bad else 0
