"""``rpc-attention plan``: write the pre-registered plan of the paper study's confirmatory run from pilots.

``plan --pilot runs/paper-pilot --pilot docs/results/decide.json:clean,mce --budget-hours 5 --out
docs/plans/paper.json`` reads each pilot's ``results.json`` (a study directory or a results file; after a
colon, the claims to take from it; the plan's settings are the first paper pilot's), sizes every claim (seeds, test examples) for 80 % power at its target
within the budget, prints the plan as a table and writes it. Commit the file before the run:
``rpc-attention reproduce --study paper --set plan=docs/plans/paper.json --out runs/paper``."""

from __future__ import annotations

import argparse

HELP = "write the paper study's pre-registered plan (claims, targets, margins, seeds, examples) from pilots"
EXTRA = "report"  # the extra this command needs: pip install "rpc-attention[report]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pilot", action="append", required=True, metavar="RESULTS[:CLAIM,...]",
                        help="a pilot's study directory or results JSON, optionally with the claims to take from "
                             "it (repeatable; the first source with a claim wins)")
    parser.add_argument("--budget-hours", type=float, default=5.0, metavar="H",
                        help="cap on the run's wall time at --jobs stages at once (default 5)")
    parser.add_argument("--jobs", type=int, default=2, metavar="N", help="stages at once in the run (default 2)")
    parser.add_argument("--seed-base", type=int, default=1000, metavar="S",
                        help="the first confirmatory seed (default 1000; no pilot may have used it)")
    parser.add_argument("--out", required=True, metavar="FILE", help="the plan file to write (e.g. docs/plans/paper.json)")
    parser.add_argument("--note", action="append", default=[], metavar="TEXT",
                        help="a reason for a choice the plan cannot show (repeatable; kept in the plan)")
    parser.add_argument("--force", action="store_true", help="replace an existing plan file")
    g = parser.add_argument_group("the second plan format (targets on the natural scale, the verdict 'smaller "
                                  "than the paper's effect', one cost model; docs/reproduce.md)")
    g.add_argument("--format", type=int, choices=(1, 2), default=1, help="plan format (default 1)")
    g.add_argument("--costs", action="append", default=[], metavar="RESULTS",
                   help="format 2: a study measured on the CPU the plan is for, whose stages give the cost model "
                        "(repeatable; the first with a stage wins)")
    g.add_argument("--reference", metavar="RESULTS",
                   help="format 2: a larger run (another CPU) whose stages fill in the cost model, scaled to this CPU")
    g.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="format 2: a study setting that differs from the first source's (repeatable)")
    g.add_argument("--load-factor", type=float, default=1.0, metavar="F",
                   help="format 2: wall seconds per CPU second of a stage under the expected load (default 1)")


def _source(spec: str):
    import json
    from pathlib import Path

    from . import UserError

    path, _, ids = spec.partition(":")
    p = Path(path)
    f = p / "results.json" if p.is_dir() else p
    try:
        res = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"--pilot {spec}: cannot read {f} as results JSON ({exc})") from None
    if not isinstance(res, dict) or "claims" not in res:
        raise UserError(f"--pilot {spec}: {f} is not a study's results.json")
    return path, res, set(x for x in ids.split(",") if x) if ids else None


def run(args: argparse.Namespace) -> int:
    import time

    from ..markdown import markdown_table
    from ..reproduce import StudyError
    from ..reproduce.plan import make_plan, write_plan
    from . import UserError

    if args.budget_hours <= 0 or args.jobs < 1:
        raise UserError("--budget-hours must be > 0 and --jobs >= 1")
    if args.seed_base < 0:
        raise UserError("--seed-base must be >= 0")
    sources = [_source(s) for s in args.pilot]
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.format == 1 and (args.costs or args.reference or args.settings or args.load_factor != 1.0):
        raise UserError("--costs, --reference, --set and --load-factor belong to --format 2")
    if args.load_factor <= 0:
        raise UserError("--load-factor must be > 0")
    try:
        if args.format == 2:
            from ..overrides import parse_assignments
            from ..reproduce.plan import make_plan_2

            costs = [_source(c)[:2] for c in args.costs]
            reference = _source(args.reference)[:2] if args.reference else None
            plan = make_plan_2(sources, costs, reference, args.budget_hours, args.jobs, args.seed_base,
                               settings=dict(parse_assignments(args.settings)), created=created, notes=args.note,
                               load_factor=args.load_factor)
        else:
            plan = make_plan(sources, args.budget_hours, args.jobs, args.seed_base, created=created,
                             notes=args.note)
        rows = [[c["id"], c["status"], f"{c['target']:.3g}" if c.get("target") else "—",
                 f"{c['margin']:.3g}" if c.get("margin") else "—", len(c.get("seeds") or []) or "—",
                 c.get("examples") or ("all" if c.get("seeds") else "—"),
                 f"{c['power']:.2f}" if c.get("power") is not None else "—",
                 f"{c['mde']:.3g}" if c.get("mde") is not None else "—"] for c in plan["claims"]]
        for line in markdown_table(["claim", "status", "target", "margin", "seeds", "examples", "power at target",
                                    "MDE"], rows):
            print(line)
        b = plan["budget"]
        print(f"estimated {b['estimate_hours']:.2f} h of wall time at {b['jobs']} stages at once (cap "
              f"{b['cap_hours']:g} h)" + (f"; {b['estimate_cpu_s'] / 3600:.2f} CPU hours; expected decided claims "
                                         f"{b['expected_decided']:.2f} of {b['claims']}" if "expected_decided" in b
                                         else ""))
        digest = write_plan(plan, args.out, force=args.force)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    print(f"wrote {args.out} (sha256 {digest}); commit it before the run")
    return 0
