"""Task registry: every task the studies know, by name."""
from __future__ import annotations

from tasks.base import SPLITS, DataBound, DataBoundError, EvalSet, Task, TaskConfig, wilson
from tasks.countdown import Countdown, CountdownConfig
from tasks.sudoku import Sudoku, SudokuConfig
from tasks.text8 import Text8, Text8Config

TASKS: dict[str, tuple[type[TaskConfig], type[Task]]] = {
    "sudoku": (SudokuConfig, Sudoku),
    "countdown": (CountdownConfig, Countdown),
    "text8": (Text8Config, Text8),
}


def make_task(cfg: TaskConfig) -> Task:
    name = getattr(cfg, "name", None)
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name][1](cfg)


__all__ = ["SPLITS", "TASKS", "DataBound", "DataBoundError", "EvalSet", "Task", "TaskConfig", "make_task", "wilson"]
