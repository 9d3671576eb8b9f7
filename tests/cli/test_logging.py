"""Library code logs; the command line routes the records to stderr at the level -v / -q choose."""

import contextlib
import io
import logging

import pytest

from rpc_attention.cli import build_parser, configure_logging
from rpc_attention.evaluate.predict import progress
from rpc_attention.reproduce.pipeline import Pipeline, Stage


@pytest.fixture
def package_logger():
    logger = logging.getLogger("rpc_attention")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:], logger.level, logger.propagate = saved


def _emit_all(name="rpc_attention.test"):
    log = logging.getLogger(name)
    log.debug("d-msg")
    log.info("i-msg")
    log.warning("w-msg")
    log.error("e-msg")


@pytest.mark.parametrize("verbosity, shown", [(1, "diwe"), (0, "iwe"), (-1, "we"), (-2, "e")])
def test_verbosity_levels(package_logger, capsys, verbosity, shown):
    configure_logging(verbosity)
    _emit_all()
    err = capsys.readouterr().err
    for letter in "diwe":
        assert (f"{letter}-msg" in err) == (letter in shown), (letter, err)
    if "w" in shown:
        assert "warning: w-msg" in err  # warnings and errors name their level; info lines do not
    assert "info:" not in err


def test_records_follow_a_redirected_stderr_and_one_handler_per_call(package_logger, capsys):
    configure_logging(0)
    configure_logging(0)  # a second command in the same process must not print everything twice
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):  # what a study stage does with its log file
        logging.getLogger("rpc_attention.reproduce.stages").info("inside the stage")
    assert buffer.getvalue() == "inside the stage\n"
    assert "inside the stage" not in capsys.readouterr().err


def test_flags_count_after_the_command():
    args = build_parser().parse_args(["pap-demo", "-qq"])
    assert args.verbose - args.quiet == -2
    args = build_parser().parse_args(["bench", "--smoke", "-v"])
    assert args.verbose - args.quiet == 1


def test_quiet_turns_progress_bars_off(package_logger, monkeypatch):
    monkeypatch.delenv("RPC_ATTENTION_NO_PROGRESS", raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    package_logger.setLevel(logging.NOTSET)
    assert progress(range(2)).disable is False  # a library user who configured nothing keeps bars
    package_logger.setLevel(logging.WARNING)  # rpc-attention -q
    assert progress(range(2)).disable is True


def test_pipeline_progress_is_logged_by_default(tmp_path, caplog):
    pipe = Pipeline([Stage("a", "x", lambda ctx: None)], tmp_path)
    with caplog.at_level(logging.INFO, logger="rpc_attention.reproduce.pipeline"):
        pipe.run()
    assert any(r.message.startswith("> a:") for r in caplog.records)
    assert any(r.message.startswith("+ a: done") for r in caplog.records)
