"""One plain line for a failed run: the root cause, never Ray's wrapper.

A trial that raises reaches the driver as `ray.exceptions.RayTaskError(ValueError)`, whose text starts
with "ray::ImplicitFunc.train() (pid=..., ip=...)" (colored with ANSI escapes on a terminal), then Ray's
traceback, and only at its end the trial's own exception. `runs.error` and `study status` keep that
last part, "FloatingPointError: non-finite loss nan at step 3", in plain text on one line; the whole
traceback stays in logs/<run_id>.log.
"""
from __future__ import annotations

import re

# CSI sequences (colors, cursor moves) and the two-byte escapes
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
# the line Python ends a traceback with: "ValueError: ...", "pkg.mod.MyError: ...", "RayTaskError(ValueError): ..."
EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(\([\w.]+\))?(: |$)")
LIMIT = 300  # characters of the one line


def plain(text: str) -> str:
    """`text` without ANSI escape sequences or other control characters (newlines and tabs kept)."""
    text = ANSI.sub("", text)
    return "".join(c for c in text if c in "\n\t" or c.isprintable())


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= LIMIT else line[:LIMIT - 3] + "..."


def root_exception(e: BaseException) -> BaseException:
    """The innermost exception of Ray's wrappers (RayTaskError.cause, RayActorError.cause) and of
    exceptions raised `from` another that carries no message of its own."""
    seen = set()
    while id(e) not in seen and isinstance(getattr(e, "cause", None), BaseException):
        seen.add(id(e))
        e = e.cause
    return e


def error_line(e: BaseException | None) -> str | None:
    """The root cause of exception `e` as one plain line, "FloatingPointError: non-finite loss ...";
    None for None."""
    if e is None:
        return None
    root = root_exception(e)
    name = type(root).__name__
    if name.startswith("RayTaskError") or name.startswith("TuneError"):  # no cause to unwrap: read its text
        return root_cause(str(root)) or name
    msg = _one_line(plain(str(root)))
    return _one_line(f"{name}: {msg}" if msg else name)


def root_cause(error: str | None) -> str | None:
    """The root cause in an error text (a stored `runs.error`, a formatted exception): its last line that
    reads as an exception ("ValueError: ..."), else its last line; plain, one line, at most LIMIT
    characters. Text that is already one such line comes back as it is."""
    if not error:
        return error
    raw = [ln.rstrip() for ln in plain(str(error)).splitlines() if ln.strip()]
    if not raw:
        return None
    # a traceback's code lines are indented; the exception's own line starts at column 0
    exc = [ln for ln in raw if EXC_LINE.match(ln) and not ln.startswith(("Traceback", "During handling",
                                                                          "The above exception"))]
    line = exc[-1] if exc else raw[-1].strip()
    # "RayTaskError(ValueError): ray::ImplicitFunc.train() (pid=...": the wrapper's line names no cause
    if re.match(r"^[\w.]*RayTaskError", line) and len(exc) > 1:
        line = exc[-2]
    return _one_line(line)
