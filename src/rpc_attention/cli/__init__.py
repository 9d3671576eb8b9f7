"""``rpc-attention`` command line.

Each sub-command lives in its own module ``rpc_attention.cli.<name>`` defining::

    HELP = "one line"
    EXTRA = "train"    # the extra of ``pip install 'rpc-attention[...]'`` it needs (None: the core suffices)
    def add_arguments(parser: argparse.ArgumentParser) -> None: ...
    def run(args: argparse.Namespace) -> int: ...
    def resume_hint(args: argparse.Namespace) -> str: ...   # optional: printed after Ctrl-C

and is listed in :func:`commands`. Every module is imported to build the parser, so keep heavy imports
inside ``run``. A command holds argument handling and printing only; what it does is a library
function a study stage can call too. Errors meant for users raise :class:`UserError` (one line, exit
code 2).

Library modules log through ``logging`` (``rpc_attention.*`` loggers); :func:`configure_logging`
sends those records to stderr at the level ``-v`` / ``-q`` choose. What a command prints on stdout
(tables, the report path) is its output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from types import ModuleType
from typing import List, Optional, Tuple

from ..extras import MissingExtraError, missing_extra


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit code 2, no traceback."""


def check_device(spec: Optional[str]) -> None:
    """:class:`UserError` (one line) unless the torch device ``spec`` exists on this machine; ``None`` and
    ``auto`` pass. Every command's ``--device`` is checked here, once, before the command runs."""
    if spec is None or str(spec) == "auto":
        return
    import torch

    try:
        dev = torch.device(str(spec))
    except (RuntimeError, ValueError):
        raise UserError(f"--device {spec}: not a torch device (cpu, cuda, cuda:1, mps, ...)") from None
    if dev.type == "cpu":
        return
    if dev.type == "mps":
        available, count = torch.backends.mps.is_available(), 1
    else:
        backend = getattr(torch, dev.type, None)  # torch.cuda, torch.xpu, ...
        available = bool(backend is not None and getattr(backend, "is_available", lambda: False)())
        count = int(getattr(backend, "device_count", lambda: 1)()) if available else 0
    if not available:
        raise UserError(f"--device {spec}: this machine has no {dev.type} device (torch sees none); use --device cpu")
    if dev.index is not None and dev.index >= count:
        raise UserError(f"--device {spec}: this machine has {count} {dev.type} device(s), numbered from 0")


def commands() -> List[Tuple[str, ModuleType]]:
    """``(command name, module)`` of every sub-command, in the order ``--help`` lists them."""
    from . import (
        analyze,
        bench,
        compare,
        eval,
        eval_external,
        generate,
        pap_demo,
        plan,
        presets,
        publish,
        reproduce,
        robustness,
        train,
        verify,
    )

    return [("analyze", analyze), ("bench", bench), ("compare", compare), ("eval", eval),
            ("eval-external", eval_external), ("generate", generate), ("pap-demo", pap_demo),
            ("plan", plan), ("presets", presets), ("publish", publish), ("reproduce", reproduce), ("robustness", robustness), ("train", train),
            ("verify", verify)]


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (as ``logging.lastResort``), so a redirection of
    stderr (a study stage's log file, pytest's capture) also captures the records."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property reads sys.stderr
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def configure_logging(verbosity: int = 0) -> None:
    """Route the package's log records to stderr: ``verbosity`` 0 shows INFO (progress, notes), 1+
    DEBUG, -1 warnings only, -2 errors only. Replaces the handler of an earlier call."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG if verbosity > 0 else logging.ERROR)
    package_logger = logging.getLogger("rpc_attention")
    for handler in [h for h in package_logger.handlers if isinstance(h, _StderrHandler)]:
        package_logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter("%(message)s"))
    package_logger.addHandler(handler)
    package_logger.setLevel(level)


def _verbosity_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("output")
    group.add_argument("-v", "--verbose", action="count", default=0,
                       help="more log output on stderr (debug messages)")
    group.add_argument("-q", "--quiet", action="count", default=0,
                       help="less log output on stderr: -q warnings only (no progress), -qq errors only")
    return common


def _unavailable(exc: Exception, args: argparse.Namespace) -> int:
    raise exc


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="rpc-attention",
        description="RPC-Attention: robust attention by Principal Attention Pursuit, and the kernel-PCA view of attention.",
    )
    parser.add_argument("--version", action="version", version=f"rpc-attention {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = _verbosity_options()
    for name, module in commands():
        p = sub.add_parser(name, help=getattr(module, "HELP", ""), description=getattr(module, "HELP", None),
                           parents=[common])
        try:
            module.add_arguments(p)
        except MissingExtraError as exc:
            # the command's options come from a part that needs an extra: the command stays listed and
            # running it says what to install
            p.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            p.set_defaults(_run=partial(_unavailable, exc), _resume_hint=None, _extra=module.EXTRA)
            continue
        p.set_defaults(_run=module.run, _resume_hint=getattr(module, "resume_hint", None), _extra=module.EXTRA)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args._argv = argv  # the command as given (a resume hint repeats it)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    configure_logging(args.verbose - args.quiet)
    import torch

    # Before any parallel op, so that the OpenMP workers inherit it: see docs/performance.md
    # (denormals make PAP's backward 10-100x slower on x86 CPUs). No effect on GPUs.
    torch.set_flush_denormal(True)
    try:
        check_device(getattr(args, "device", None))
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"rpc-attention {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # an optional dependency the command needs: one line with the command's extra (its EXTRA)
        missing = missing_extra(exc, getattr(args, "_extra", None) or "all", "this command")
        if missing is None:
            raise
        print(f"rpc-attention {args.command}: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        hint = args._resume_hint(args) if getattr(args, "_resume_hint", None) else ""
        print(f"interrupted{'; ' + hint if hint else ''}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
