"""Task registry: every task the studies know, by name, and what each declares about its metrics.

Everything outside tasks/ asks here (never a table of its own keyed by task or metric name), so a new
task is one file plus one `register` call.

A task defined outside this package (a plugin) is known to every process of a study -- the CLI, the
Ray workers that train and evaluate, `study verify` and the report -- when its module is named in the
environment variable RMDM_STUDY_TASKS (comma-separated importable module names; local Ray workers
inherit the driver's environment, a cluster's nodes need it set where they start) or in the entry-point
group `rmdm_study.tasks` of an installed package. Importing `tasks` imports each such module, which
calls `tasks.register` at import.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os

from tasks.base import (SPLITS, DataBound, DataBoundError, EvalSet, InputFileError, Inputs, Metric, NotRescorable,
                        Task, TaskConfig)
from tasks.countdown import Countdown, CountdownConfig
from tasks.sudoku import Sudoku, SudokuConfig
from tasks.text8 import Text8, Text8Config

TASKS: dict[str, tuple[type[TaskConfig], type[Task]]] = {}

# metrics no task declares but the tool itself records (the training loss of the history table)
GENERIC_METRICS = {"loss": Metric("loss", "training loss", higher_is_better=False)}
PLUGIN_ENV = "RMDM_STUDY_TASKS"  # comma-separated modules that register tasks, imported with `tasks`
PLUGIN_GROUP = "rmdm_study.tasks"  # entry points whose modules register tasks


def register(config_cls: type[TaskConfig], task_cls: type[Task]) -> None:
    """Make a task known to grids, runs, evaluation and the report by its `name`."""
    name = task_cls.name
    if TASKS.get(name) == (config_cls, task_cls):
        return  # the same module registering again (imported by the plugin variable and by hand)
    if name in TASKS:
        have = TASKS[name][1]
        raise ValueError(f"task {name!r} of {task_cls.__module__}.{task_cls.__qualname__} clashes with the task "
                         f"{name!r} already registered by {have.__module__}.{have.__qualname__}: give it "
                         f"another name")
    _check_declarations(name, config_cls, task_cls)
    TASKS[name] = (config_cls, task_cls)


def _check_declarations(name: str, config_cls: type[TaskConfig], task_cls: type[Task]) -> None:
    """What tasks/base.py says every task declares, present (a ValueError names what is missing)."""
    fields = getattr(config_cls, "model_fields", None)  # pydantic's; a plain class (gpu_check's stand-in): its attribute
    default = getattr(fields.get("name"), "default", None) if fields is not None else getattr(config_cls, "name", None)
    if default != name:
        raise ValueError(f"task {name!r}: its config {config_cls.__qualname__} needs a field "
                         f"`name: Literal[{name!r}] = {name!r}` (grids and stored configs name the task)")
    missing = [f for f in TaskConfig.REQUIRED_FIELDS if fields is not None and f not in fields]
    if missing:
        raise ValueError(f"task {name!r}: its config {config_cls.__qualname__} lacks the field(s) {', '.join(missing)} "
                         f"every task declares (n_test: test examples; n_val: validation examples or None for n_test)")
    if task_cls.eval_mode == "likelihood" and task_cls.t_values is Task.t_values:
        raise ValueError(f"task {name!r}: eval_mode 'likelihood' needs t_values(), the noise levels of its NLL bound")
    if task_cls.eval_mode == "likelihood" and 1.0 not in {m.likelihood for m in task_cls.likelihood_metrics()}:
        raise ValueError(f"task {name!r}: eval_mode 'likelihood' needs a stored metric with likelihood=1.0 (the NLL "
                         f"bound in nats per position)")
    if task_cls.primary_metric not in {m.name for m in task_cls.metrics}:
        raise ValueError(f"task {name!r}: primary_metric {task_cls.primary_metric!r} is not one of its metrics")
    if task_cls.sample_score is not None and task_cls.sample_score not in task_cls.metric_names_of():
        raise ValueError(f"task {name!r}: sample_score {task_cls.sample_score!r} is not one of its stored metrics")
    names = [m.name for m in task_cls.metrics]
    if len(set(names)) != len(names):
        raise ValueError(f"task {name!r} declares a metric twice: {names}")


class UnknownTask(ValueError):
    """A task name no registered task has (a plugin task whose module is not named): one line, exit 2."""


def how_to_register() -> str:
    return (f"known tasks: {', '.join(sorted(TASKS))}; a task of a plugin module is registered by naming its module "
            f"in {PLUGIN_ENV} (e.g. {PLUGIN_ENV}=my_tasks) or in a package's {PLUGIN_GROUP} entry points")


def check_registered(names) -> None:
    """UnknownTask for the first of `names` (the tasks a store's runs or a grid name) not registered here."""
    for name in sorted(set(names) - set(TASKS), key=str):
        raise UnknownTask(f"unknown task {name!r}; {how_to_register()}")


def task_class(name: str) -> type[Task]:
    check_registered([name])
    return TASKS[name][1]


def make_task(cfg: TaskConfig) -> Task:
    return task_class(getattr(cfg, "name", None))(cfg)


def metric(name: str, task: str | None = None) -> Metric:
    """The declaration of metric `name`: task `task`'s (each task names its metrics in a namespace of its
    own), else the first registered task's that declares one of that name, else a generic one; unknown names
    get a plain 'mean' metric labelled by its name."""
    own = TASKS[task][1].metric_of(name) if task in TASKS else None
    if own is not None:
        return own
    for _, cls in TASKS.values():
        m = cls.metric_of(name)
        if m is not None:
            return m
    if name in GENERIC_METRICS:
        return GENERIC_METRICS[name]
    return Metric(str(name), str(name))


def is_rate(name: str, task: str | None = None) -> bool:
    return metric(name, task).kind == "rate"


def lower_is_better(name: str, task: str | None = None) -> bool:
    return not metric(name, task).higher_is_better


def is_likelihood(task: str) -> bool:
    """Whether task `task` is evaluated by its likelihood (eval_mode 'likelihood'); False for an unknown one."""
    return task in TASKS and TASKS[task][1].eval_mode == "likelihood"


def run_column_names() -> tuple[str, ...]:
    """Every run column a registered task fills (Task.run_column_names), in registration order."""
    return tuple(dict.fromkeys(c for _, cls in TASKS.values() for c in cls.run_column_names))


def aliases() -> dict[str, str]:
    """Short grid keys the registered tasks declare (Task.aliases): {"mask_rate": "task.mask_rate", ...}."""
    return {a: f"task.{a}" for _, cls in TASKS.values() for a in cls.aliases}


def primary_metric(task: str, available) -> str:
    """The task's headline metric if present, else the first registered task's headline present."""
    avail = set(available)
    cls = TASKS.get(task, (None, None))[1]
    if cls is not None and cls.primary_metric in avail:
        return cls.primary_metric
    for _, c in TASKS.values():
        if c.primary_metric in avail:
            return c.primary_metric
    heads = ", ".join(c.primary_metric for _, c in TASKS.values())
    raise LookupError(f"no primary metric ({heads}) for task {task!r}; metrics present: {sorted(avail)}")


def load_plugins() -> None:
    """Import every module RMDM_STUDY_TASKS and the `rmdm_study.tasks` entry points name (each registers
    its tasks); an import that fails says which module and why."""
    names = [m.strip() for m in os.environ.get(PLUGIN_ENV, "").split(",") if m.strip()]
    names += [ep.module for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)]
    for mod in dict.fromkeys(names):
        try:
            importlib.import_module(mod)
        except ImportError as e:  # a usage mistake (a misspelt name): exit 2, one line
            raise UnknownTask(f"task plugin module {mod!r} (from {PLUGIN_ENV} or the {PLUGIN_GROUP} entry points) "
                              f"does not import: {e}") from e


for _cfg, _task in ((SudokuConfig, Sudoku), (CountdownConfig, Countdown), (Text8Config, Text8)):
    register(_cfg, _task)
load_plugins()


__all__ = ["PLUGIN_ENV", "PLUGIN_GROUP", "SPLITS", "TASKS", "DataBound", "DataBoundError", "EvalSet",
           "InputFileError", "Inputs", "Metric", "NotRescorable", "Task", "TaskConfig", "UnknownTask", "aliases",
           "check_registered", "how_to_register", "is_likelihood", "is_rate", "load_plugins", "lower_is_better",
           "make_task", "metric", "primary_metric", "register", "run_column_names", "task_class"]
