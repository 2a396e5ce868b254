"""`study`: plan, run, inspect and report R-MDM scaling studies.

The command line, one module per job: base.py (the typer app, one-line errors, plain help), checks.py
(what the commands check before any work), then the commands in the order `study --help` lists them:
plan.py, run.py (run, status, prune, tune), report.py, tools.py (verify, predict, eval, text8-download).
"""
from __future__ import annotations

import sys

from study.cli.base import app
from study.cli import plan, run, report, tools  # noqa: F401 -- each registers its commands on `app`, in this order

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())
