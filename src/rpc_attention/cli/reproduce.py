"""``rpc-attention reproduce``: run a whole study (train, evaluate, analyse, report) as a resumable pipeline."""

from __future__ import annotations

import argparse

HELP = "run a reproduction study as a resumable pipeline of stages and write its report"
EXTRA = "all"  # the extra this command needs: pip install "rpc-attention[all]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("study")
    g.add_argument("--study", default=None, metavar="NAME",
                   help="study: smoke, quick (default; `make demo`), decide, lm-gap, fmnist-full, imagenet, wikitext103 "
                        "(--list shows them; trainer presets are a different thing: `rpc-attention presets`)")
    g.add_argument("--preset", dest="study_alias", default=None, metavar="NAME", help="deprecated alias of --study")
    g.add_argument("--out", default=None, metavar="DIR", help="study directory (default: runs/<study>)")
    g.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="study setting, repeatable; values are YAML: seeds=[0,1,2] (or 0,1,2), eval_limit=500, "
                        "data.imagenet=PATH, analyze_sets=[limit=4] ... (--list shows each study's settings)")
    g.add_argument("--list", action="store_true", help="list the studies and their settings")
    p = parser.add_argument_group("power (reads a finished study; runs nothing)")
    p.add_argument("--power", default=None, metavar="DIR",
                   help="print, per claim of the finished study in DIR (its results.json): delta / sd of the paired "
                        "per-seed differences, the minimum detectable effect at 80 %% power for the claim's family, "
                        "and the seeds and test examples its target effect needs")
    p.add_argument("--target", dest="targets", action="append", default=[], metavar="CLAIM=EFFECT",
                   help="with --power: the effect to plan for, in the metric's units (default: the claim's target, "
                        "the paper's improvement in our units); repeatable")
    r = parser.add_argument_group("running")
    r.add_argument("--stages", action="append", default=None, metavar="NAMES",
                   help="run only these stages: names, globs or kinds, comma separated "
                        "('train.*', 'eval.*.pgd', 'report'); a stage's unfinished dependencies must be selected too")
    r.add_argument("--dry-run", action="store_true", help="print the plan with estimated times and exit")
    r.add_argument("--force", action="store_true",
                   help="rerun the selected stages even if finished; also accepts a DIR that holds another study "
                        "(which is removed first: the directory restarts cleanly) or this study with other settings")
    r.add_argument("--stop-on-error", action="store_true",
                   help="stop at the first failed stage (default: run the stages that do not depend on it)")
    r.add_argument("--save-state", default=None, metavar="PATH",
                   help="write the state of the study in --out to PATH without model weights (finished stages and "
                        "their records; a model whose evaluations are unfinished is left to train again), and exit: "
                        "a long run carried to another machine or session")
    r.add_argument("--load-state", default=None, metavar="PATH",
                   help="put a state written by --save-state back as --out, then "
                        "run the study on it, which resumes with the remaining stages (--out must not exist or be empty)")
    r.add_argument("--device", default=None, help="device for training and evaluation (default: the study's; cpu)")
    r.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads for every stage, training included (default: torch's default; "
                        "the trainer: the presets' own, then torch's); part of every stage's fingerprint")
    add_launch_arguments(parser)


SLURM_OPTIONS = ("partition", "time", "account", "qos", "constraint", "nodes", "gpus_per_node", "cpus_per_task")


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """How the stages run: the launchers, ``--jobs``, the SLURM job options and ``--status``."""
    g = parser.add_argument_group("launchers (docs/reproduce.md#launchers)")
    g.add_argument("--launcher", default="local", choices=["local", "slurm", "submitit-local"],
                   help="local: on this machine (default; one stage at a time in this process, or --jobs N "
                        "worker processes); slurm: each stage one SLURM job through submitit (training: --nodes x "
                        "--gpus-per-node GPUs, DDP; evaluation and analysis: one GPU), logs in DIR/logs/submitit; "
                        "submitit-local: the slurm path through submitit's local executor (one process per stage)")
    g.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="run up to N stages at once, dependencies respected (default: 1 locally, no limit on "
                        "SLURM). Every stage runs with the same torch thread count (--threads, else this process's "
                        "default; on SLURM --cpus-per-task), which enters its fingerprint: the numbers do not "
                        "depend on the launcher or on what runs beside a stage")
    g.add_argument("--status", metavar="DIR", default=None,
                   help="print each stage of the study in DIR (queued / running / done / failed / skipped / "
                        "interrupted / not run) with its job id and log, and exit")
    s = parser.add_argument_group("SLURM jobs (--launcher slurm)")
    s.add_argument("--partition", default=None, help="SLURM partition of every job")
    s.add_argument("--time", type=int, default=None, metavar="MINUTES",
                   help="time limit of every job (required with --launcher slurm; at least 3: SLURM warns a job "
                        "120 s before its limit); a job at its limit is requeued and resumes")
    s.add_argument("--account", default=None, help="SLURM account")
    s.add_argument("--qos", default=None, help="SLURM quality of service")
    s.add_argument("--constraint", default=None, help="SLURM node constraint (e.g. a100)")
    s.add_argument("--nodes", type=int, default=None, help="nodes of each training job (default 1)")
    s.add_argument("--gpus-per-node", type=int, default=None,
                   help="GPUs (= DDP tasks) per training node (default 8; with --device cpu 0: no job asks for a GPU)")
    s.add_argument("--cpus-per-task", type=int, default=None, help="CPUs per task of every job (default 10)")


def launch_options(args: argparse.Namespace):
    """The :class:`LaunchOptions` of ``--launcher``, ``--jobs`` and the SLURM options."""
    from ..reproduce import LaunchOptions, SlurmOptions

    given = {k: getattr(args, k) for k in SLURM_OPTIONS if getattr(args, k) is not None}
    values = {("time_min" if k == "time" else k): v for k, v in given.items()}
    return LaunchOptions(args.launcher, args.jobs, SlurmOptions(**values),
                         given=tuple("--" + k.replace("_", "-") for k in given))


def print_status(out: str) -> int:
    """``--status DIR``: the table of the study's stages."""
    from ..markdown import format_seconds, markdown_table
    from ..reproduce import StudyError, study_status
    from . import UserError

    try:
        rows = study_status(out)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    table = [[r["name"], r["kind"], r["status"], r["job_id"] or "", format_seconds(r["seconds"]) if r["seconds"] else "",
              r["log"] or "", r["reason"] or ""] for r in rows]
    print("\n".join(markdown_table(["stage", "kind", "status", "job", "time", "log", "reason"], table)))
    counts = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"{out}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0


def study_name(args: argparse.Namespace) -> str:
    """``--study`` (or its deprecated alias ``--preset``, with a warning); default ``quick``."""
    import sys

    from . import UserError

    if args.study_alias is not None:
        if args.study is not None and args.study != args.study_alias:
            raise UserError("give the study once: --study NAME (--preset is its deprecated alias)")
        print(f"rpc-attention reproduce: --preset is deprecated; use --study {args.study_alias}", file=sys.stderr)
        return args.study_alias
    return args.study or "quick"


def resume_hint(args: argparse.Namespace) -> str:
    """After Ctrl-C (or SIGTERM / SIGHUP): the command as it was given resumes the study, every option
    kept (the launcher, --threads and --set enter what a stage is, so a command without them would
    rerun the study with other settings), except --force, which would start the finished stages over."""
    import shlex

    if args.list or args.dry_run or args.status or args.power:
        return ""
    argv = [a for a in getattr(args, "_argv", None) or [] if a != "--force"]
    if not argv:
        study = args.study or args.study_alias or "quick"
        argv = ["reproduce", "--study", study] + (["--out", args.out] if args.out else [])
    return (f"run `{shlex.join(['rpc-attention', *argv])}` again to resume "
            "(finished stages are kept, the interrupted one continues from its checkpoint)")


def _targets(items) -> dict:
    from . import UserError

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise UserError(f"--target {item!r}: give CLAIM=EFFECT, e.g. --target clean=1.0")
    return out


def power(directory: str, targets: dict) -> int:
    """``--power DIR``: the power table of every claim of the finished study in DIR."""
    import json
    from pathlib import Path

    from ..report.families import power_rows, power_text
    from . import UserError

    path = Path(directory) / "results.json"
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"--power {directory}: no readable results.json of a finished study there ({exc})") from None
    known = {c["id"] for c in res.get("claims") or []}
    unknown = sorted(set(targets) - known)
    if unknown:
        raise UserError(f"--target {', '.join(unknown)}: not a claim of this study ({', '.join(sorted(known))})")
    rows = power_rows(res, targets)
    if not rows:
        print(f"{path}: no claim has numbers")
        return 0
    print("\n".join(power_text(rows)))
    print("MDE, seeds: the effect called reproduced with 80 % power at Holm's strictest step of the claim's family "
          "(alpha / m; exact noncentral t); MDE, examples: the example interval's bound past the margin. No noise "
          "figure (one seed): run the study with two or more seeds first.")
    return 0


def _save_state(out: str, dest: str) -> int:
    """``--save-state``: the finished stages and records of ``out`` into ``dest``."""
    from ..reproduce import StudyError
    from ..reproduce.state import save_state
    from . import UserError

    try:
        got = save_state(out, dest)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    print(f"saved {got['stages']} finished stages of {out} to {dest} ({got['bytes'] / 1e6:.1f} MB); "
          f"{len(got['retrain'])} trainings with unfinished evaluations will run again")
    return 0


def _load_state(src: str, out: str) -> None:
    """``--load-state``: a saved state into ``out`` before the study runs."""
    from ..reproduce import StudyError
    from ..reproduce.state import load_state
    from . import UserError

    try:
        got = load_state(src, out)
    except StudyError as exc:
        raise UserError(str(exc)) from None
    print(f"loaded {got['stages']} finished stages from {src} into {out}")


def run(args: argparse.Namespace) -> int:
    import os
    import time

    from ..markdown import format_seconds
    from ..reproduce import StageSelectionError, StudyError, run_study
    from ..reproduce.studies import list_studies
    from . import UserError

    if args.power is not None:
        return power(args.power, _targets(args.targets))
    if args.targets:
        raise UserError("--target needs --power DIR")
    if args.status is not None:
        return print_status(args.status)
    if args.list:
        for name, desc, defaults in list_studies():
            print(f"{name}: {desc}")
            print("  settings: " + ", ".join(f"{k}={v}" for k, v in defaults.items()))
        return 0
    study = study_name(args)
    os.environ.setdefault("MPLBACKEND", "Agg")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError("--threads must be >= 1")
        import torch

        torch.set_num_threads(args.threads)
    out = args.out or os.path.join("runs", study)
    if args.save_state and args.load_state:
        raise UserError("--save-state and --load-state: give one")
    if args.save_state:
        return _save_state(out, args.save_state)
    if args.load_state:
        _load_state(args.load_state, out)
    t0 = time.time()
    try:
        summary = run_study(study, out, settings=args.sets, selection=args.stages, force=args.force,
                            dry_run=args.dry_run, keep_going=not args.stop_on_error, device=args.device,
                            threads=args.threads, launch=launch_options(args))
    except (StudyError, StageSelectionError) as exc:
        raise UserError(str(exc)) from None
    if args.dry_run:
        print(summary["plan"])
        if summary.get("device") not in (None, "cpu"):
            print(f"(this study runs on {summary['device']}: the estimates are CPU constants and only rank the stages)")
        return 0
    took = format_seconds(time.time() - t0)
    counts = ", ".join(f"{len(v)} {k}" for k, v in summary.items() if v)
    speak = os.environ.get("RANK", "0") == "0"  # under torchrun only global rank 0 speaks
    if speak:
        print(f"study {study} in {out}: {counts} ({took})")
    if speak and os.path.exists(os.path.join(out, "report.md")):
        print(f"report: {os.path.join(out, 'report.md')} and report.html")
    if summary["failed"] or summary["blocked"]:
        if speak:
            print("failed: " + ", ".join(summary["failed"] + summary["blocked"]) +
                  f"  (see {out}/stages/*.failed.json; rerun the same command to retry)")
        return 1
    return 0
