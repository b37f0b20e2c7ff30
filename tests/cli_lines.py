"""The one-line error every ``mmfeed`` command gives for bad input, checked in this process."""

from __future__ import annotations

from mmfeed.cli import main as cli_main


def error_line(capsys, *args: str, argparse_refusal: bool = False) -> str:
    """Run ``mmfeed ARGS`` in this process; assert exit status 2 and one line ``mmfeed: error: ...`` on stderr
    without a traceback, and return that line. With ``argparse_refusal``, argparse's own refusal passes too (its
    usage, then one line ``mmfeed COMMAND: error: ...``, the line returned)."""
    capsys.readouterr()
    try:
        code = cli_main(list(args))
    except SystemExit as exited:
        if not argparse_refusal:
            raise
        code = exited.code
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("usage: mmfeed") and "Traceback" not in err, err
        return err.strip().splitlines()[-1]
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("mmfeed: error: ") and "Traceback" not in err, err
    return lines[0]
