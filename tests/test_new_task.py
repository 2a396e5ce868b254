"""A task added in one file: sorting a short list of digits, defined, registered and run end to end here.

This module is the whole task (config, data, scoring, re-scoring, input files) and its own plugin: the
`study` processes below import it through RMDM_STUDY_TASKS (as `tests.test_new_task`), and so do the
Ray workers they start, which inherit the driver's environment. Nothing outside this file names it.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, Literal

import numpy as np
import pytest
import torch
from pydantic import Field

import tasks
from tasks import DataBound, EvalSet, InputFileError, Inputs, Metric, Task, TaskConfig


# ---- the task ----------------------------------------------------------------------------------
class SortConfig(TaskConfig):
    name: Literal["sort_digits"] = "sort_digits"
    length: int = Field(4, ge=2, le=6, description="digits per list")
    n_train: int = Field(200, ge=1)
    n_test: int = Field(32, ge=1)
    n_val: int | None = Field(None, ge=1)  # val_size (n_val, default n_test) is TaskConfig's
    data_seed: int = 0

    EVAL_FIELDS = {"test": ("n_test",), "val": ("n_test", "n_val")}  # val follows test in one permutation


class SortDigits(Task):
    """Input: `length` digits (given); output: the same digits in ascending order (to fill)."""

    name = "sort_digits"
    # `exact` is Sudoku's name too, declared otherwise: each task names its metrics in its own namespace
    metrics = (Metric("sorted_rate", "sorted-correctly rate", "rate", unit=True, threshold=0.5),
               Metric("in_order", "ascending-output rate", "rate", unit=True),
               Metric("exact", "answer equals the reference", "rate", unit=True, threshold=0.4, needs_reference=True))
    primary_metric = "sorted_rate"
    describe_fields = ("length",)
    run_column_names = ("sort_length",)  # a run column of its own in the report's tables
    aliases = ("length",)  # `length=5` on the command line, `length: [3, 4]` as an axis

    def __init__(self, cfg: SortConfig):
        super().__init__(cfg)
        self.L = cfg.length
        self.lists: np.ndarray | None = None  # (n_train + n_test + n_val, L): distinct lists, in split order

    # declarations
    @property
    def vocab_size(self) -> int:
        return 10

    def pos_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple((i,) for i in range(2 * self.L))

    def pos_sizes(self) -> tuple[int, ...]:
        return (2 * self.L,)

    def free_positions(self) -> tuple[int, int]:
        return self.L, self.L

    @classmethod
    def variant_name(cls, params: dict) -> str:
        return f"sort-{params.get('length', 4)}"

    @classmethod
    def run_columns(cls, params: dict) -> dict:
        return {"sort_length": params.get("length", 4)}

    # data
    def max_examples(self) -> DataBound:
        return DataBound(10 ** self.L, f"distinct lists of {self.L} digits")

    def prepare(self, cache_dir: str | None) -> None:
        c = self.cfg
        codes = np.random.default_rng(c.data_seed).permutation(10 ** self.L)[: c.n_train + c.n_test + c.val_size]
        self.lists = codes[:, None] // 10 ** np.arange(self.L - 1, -1, -1) % 10

    def _examples(self, lists: np.ndarray) -> EvalSet:
        x0 = torch.from_numpy(np.concatenate([lists, np.sort(lists, axis=1)], axis=1)).long()
        cond = torch.zeros_like(x0, dtype=torch.bool)
        cond[:, : self.L] = True
        return EvalSet(x0, cond)

    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.cfg.n_train, (batch_size,), generator=gen).numpy()
        ev = self._examples(self.lists[idx])
        return ev.x0, ev.cond

    def eval_set(self, split: str = "test") -> EvalSet:
        c = self.cfg
        lo = c.n_train if c.split_of(split) == "test" else c.n_train + c.n_test
        return self._examples(self.lists[lo: lo + (c.n_test if split == "test" else c.val_size)])

    # scoring
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        rows = []
        for o, r in zip(output.cpu(), ev.x0.cpu()):
            given, answer = o[: self.L], o[self.L:]
            right = bool((given == r[: self.L]).all() and (answer == torch.sort(r[: self.L]).values).all())
            rows.append({"sorted_rate": float(right), "in_order": float(bool((answer[1:] >= answer[:-1]).all())),
                         "exact": float(bool((answer == r[self.L:]).all()))})
        return rows

    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        keep = cond.tolist() if cond is not None else [True] * len(tokens)
        return "".join(str(v) if k and 0 <= v < 10 else "." for v, k in zip(tokens.tolist(), keep))

    def rescore(self, input_text: str, output_text: str, reference_text: str | None) -> dict[str, float]:
        if len(input_text) != 2 * self.L or len(output_text) != 2 * self.L or not output_text.isdigit():
            raise ValueError(f"expected {2 * self.L} digits, got input {input_text!r} and output {output_text!r}")
        x = torch.tensor([[int(ch) if ch.isdigit() else 0 for ch in input_text]])
        if reference_text is not None:
            x = torch.tensor([[int(ch) for ch in reference_text]])
        cond = torch.tensor([[ch.isdigit() for ch in input_text]])
        got = self.score(torch.tensor([[int(ch) for ch in output_text]]), EvalSet(x, cond))[0]
        return got if reference_text is not None else {k: got[k] for k in self.metrics_without_reference()}

    # external inputs: one list per line
    def read_inputs(self, path: str, chunk: int) -> Iterator[Inputs]:
        with open(path, encoding="utf-8") as f:
            lines = [(i, s.strip()) for i, s in enumerate(f, 1) if s.strip()]
        for i, s in lines:
            if len(s) != self.L or not s.isdigit():
                raise InputFileError(f"{path}:{i}: expected {self.L} digits, got {s[:40]!r}")
        for start in range(0, len(lines), chunk):
            lists = np.array([[int(ch) for ch in s] for _, s in lines[start: start + chunk]])
            ev = self._examples(lists)
            yield Inputs(ev.x0, ev.cond, None, start)

    def format_outputs(self, inputs: Inputs, output: torch.Tensor) -> str:
        return "".join(self.render(o[self.L:]) + "\n" for o in output)


if __name__ in os.environ.get(tasks.PLUGIN_ENV, "").split(","):  # imported as a plugin: a `study` process
    tasks.register(SortConfig, SortDigits)


@pytest.fixture(autouse=True)
def _registered():
    """In the test process the task is known to this module's tests only: the other tests of the session see
    the built-in tasks alone (their messages list them)."""
    tasks.register(SortConfig, SortDigits)
    yield
    tasks.TASKS.pop(SortDigits.name, None)


# ---- the test ----------------------------------------------------------------------------------
PLUGIN = {tasks.PLUGIN_ENV: "tests.test_new_task"}
GRID = """study: sorting
task: {name: sort_digits, length: 4, n_train: 200, n_test: 24, n_val: 12}
model: {d_model: 16, n_heads: 2}
train: {steps: 30, batch_size: 16, warmup: 2, checkpoint_every: 15, log_every: 10}
eval: {T: [1, 2, 4], L_s: [train], n_examples: 24}
retries: 0
axes:
  L: [1, 2]
"""


# slow set (75 s of the default suite): the default suite still runs a task from outside the package through
# plan and run (tests/test_docs.py, docs/guide/new-task.md with example_tasks/reverse_digits.py)
@pytest.mark.slow
def test_a_task_in_one_file_runs_plan_run_status_report_verify_and_eval(tmp_path):
    from store import Store
    from tests.helpers import study

    def ok(*args):
        r = study(*args, env=PLUGIN)
        assert r.returncode == 0, f"study {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
        return r

    grid, results = tmp_path / "sorting.yaml", str(tmp_path / "results")
    grid.write_text(GRID)
    plan = [json.loads(x) for x in ok("plan", str(grid), "--json").stdout.splitlines()]
    assert len([p for p in plan if not p.get("totals")]) == 2 and plan[-1]["totals"]
    # the validation split, as TaskConfig declares it (n_val = 12 of the 24 examples asked), and the task's
    # own short key `length` (Task.aliases): the plan warns of T = 4 above length 3's free positions
    val = ok("plan", str(grid), "eval.split=val", "length=3", "--json")
    totals = json.loads(val.stdout.splitlines()[-1])
    assert totals["eval_flops"] < plan[-1]["eval_flops"] and "sort_digits length=3" in val.stderr, val.stderr

    ok("run", str(grid), "--results", results, "--num-cpus", "2")
    store = Store(results, "sorting")
    runs = store.read("runs")
    assert len(runs) == 2 and (runs.status == "done").all() and set(runs.task) == {"sort_digits"}
    evals = store.read("evals")
    evals = evals[evals.sampler != "likelihood"]  # sampled points only (sampler "likelihood": test_continuous.py)
    assert set(evals.metric) == {"sorted_rate", "in_order", "exact"} and len(evals) == 2 * 3 * 3
    assert "done 2/2" in ok("status", str(grid), "--results", results).stdout

    out = tmp_path / "figures"
    report = ok("report", "--figure", "all", "--results", results, "--out", str(out))
    assert (out / "iso_param.png").stat().st_size > 10_000, report.stdout + report.stderr
    assert (out / "compute.png").exists() and (out / "report.html").exists()
    md = (out / "report.md").read_text()  # the variant's name and the metric's threshold, as the task declares
    assert "| sort-4 | (1 x 2) |" in md and "| sorted_rate | 0.5 |" in md, md
    from analysis.load import load_study

    data = load_study(results, "sorting")  # the task's own run column, beside the built-in tasks' (None here)
    assert data.runs["sort_length"].tolist() == [4, 4] and data.evals["sort_length"].eq(4).all()
    assert data.runs["sudoku_n"].isna().all()
    # `exact` in the task's namespace, not Sudoku's (whose declaration differs)
    assert tasks.metric("exact", "sort_digits").threshold == 0.4 and tasks.metric("exact", "sudoku").threshold is None

    inputs, completed = tmp_path / "lists.txt", tmp_path / "sorted.txt"
    inputs.write_text("3141\n5926\n0000\n9870\n")
    run_id = runs.sort_values("L_t").run_id.iloc[-1]
    said = ok("eval", run_id, "--puzzles", str(inputs), "--results", results, "--out", str(completed)).stdout
    assert "sorted_rate" in said and "in_order" in said
    lines = completed.read_text().splitlines()
    assert len(lines) == 4 and all(len(s) == 4 and s.isdigit() for s in lines)
    ext = store.read("evals")
    ext = ext[ext.eval_key.str.startswith("ext-")]
    assert set(ext.metric) == {"sorted_rate", "in_order"} and (ext.n_examples == 4).all()

    verified = ok("verify", "--results", results).stdout  # the grid's points and the external one
    assert "OK: every check agrees" in verified and "148 samples re-scored" in verified, verified

    # the validation split end to end: its points evaluated on the trained runs (nothing trained again),
    # reported on their own (`--split val`) and verified with the rest
    trained = store.read("runs").sort_values("run_id").train_seconds.tolist()
    ok("run", str(grid), "eval.split=val", "--results", results, "--num-cpus", "2")
    assert store.read("runs").sort_values("run_id").train_seconds.tolist() == trained
    val = store.read("evals")
    val = val[(val.split == "val") & (val.sampler != "likelihood")]
    assert set(val.metric) == {"sorted_rate", "in_order", "exact"} and len(val) == 2 * 3 * 3
    assert (val.n_examples == 12).all()  # n_val, as the task's config declares it
    ok("report", "--figure", "all", "--split", "val", "--results", results, "--out", str(tmp_path / "val"))
    assert "sorted_rate" in (tmp_path / "val" / "report.md").read_text()
    verified = ok("verify", "--results", results).stdout
    assert "OK: every check agrees" in verified and f"{148 + 2 * 3 * 12} samples re-scored" in verified, verified


def test_without_the_plugin_the_task_is_unknown_by_name(tmp_path):
    from tests.helpers import study

    grid = tmp_path / "sorting.yaml"
    grid.write_text(GRID)
    r = study("plan", str(grid), env={tasks.PLUGIN_ENV: ""})
    assert r.returncode == 2 and "unknown task 'sort_digits'" in r.stderr and "sudoku" in r.stderr, r.stderr


def test_a_plugin_that_does_not_import_is_named(tmp_path):
    from tests.helpers import study

    r = study("plan", str(tmp_path / "x.yaml"), env={tasks.PLUGIN_ENV: "no_such_task_module"})
    assert r.returncode != 0 and "task plugin module 'no_such_task_module'" in r.stderr, r.stderr


def test_a_task_named_like_a_built_in_one_is_refused():
    class Clash(SortDigits):
        name = "sudoku"

    class ClashConfig(SortConfig):
        name: Literal["sudoku"] = "sudoku"

    with pytest.raises(ValueError, match=r"task 'sudoku' of .*Clash clashes with the task 'sudoku' already "
                                         r"registered by tasks\.sudoku\.Sudoku"):
        tasks.register(ClashConfig, Clash)
    tasks.register(SortConfig, SortDigits)  # the same task again (imported twice): nothing changes
    assert tasks.task_class("sort_digits") is SortDigits


def test_a_task_missing_a_declaration_fails_when_made():
    class NoFree(SortDigits):
        free_positions = Task.free_positions  # abstract again: `study plan` could not warn about T

    with pytest.raises(TypeError, match="free_positions"):
        NoFree(SortConfig())

    class LikelihoodConfig(SortConfig):
        name: Literal["sort_nll"] = "sort_nll"

    class NoLevels(SortDigits):
        name, eval_mode = "sort_nll", "likelihood"  # scored by its NLL bound, but over which noise levels?

    with pytest.raises(ValueError, match="'sort_nll': eval_mode 'likelihood' needs t_values"):
        tasks.register(LikelihoodConfig, NoLevels)
    with pytest.raises(ValueError, match=r"its config SortConfig needs a field `name: Literal\['sort_nll'\]"):
        tasks.register(SortConfig, NoLevels)
    assert "sort_nll" not in tasks.TASKS


def test_the_config_contract_is_checked_at_register_and_inherited():
    class NoValConfig(TaskConfig):  # the test split's size but not the validation split's
        name: Literal["sort_noval"] = "sort_noval"
        n_test: int = 8

    class NoVal(SortDigits):
        name = "sort_noval"

    with pytest.raises(ValueError, match=r"'sort_noval': its config .*NoValConfig lacks the field\(s\) n_val"):
        tasks.register(NoValConfig, NoVal)

    class NatsConfig(SortConfig):
        name: Literal["sort_bits"] = "sort_bits"

    class BitsOnly(SortDigits):  # a likelihood task whose metrics hold no NLL bound in nats
        name, eval_mode, metrics = "sort_bits", "likelihood", (Metric("bits", "bits", likelihood=0.693),)
        primary_metric = "bits"

        def t_values(self):
            return torch.tensor([0.5])

    with pytest.raises(ValueError, match="'sort_bits': eval_mode 'likelihood' needs a stored metric with likelihood=1"):
        tasks.register(NatsConfig, BitsOnly)
    assert "sort_noval" not in tasks.TASKS and "sort_bits" not in tasks.TASKS
    c = SortConfig(n_test=10)  # what plan's cost model and check_data read, from TaskConfig
    assert (c.val_size, c.split_size("test"), c.split_size("val"), c.train_size) == (10, 10, 10, 200)
    assert SortConfig(n_test=10, n_val=3).split_size("val") == 3


def test_the_toy_task_rescores_what_it_renders():
    task = SortDigits(SortConfig(n_train=20, n_test=4))
    task.prepare(None)
    ev = task.eval_set("test")
    scores = task.score(ev.x0, ev)
    assert all(s == {"sorted_rate": 1.0, "in_order": 1.0, "exact": 1.0} for s in scores)
    inp, out = task.render(ev.x0[0], ev.cond[0]), task.render(ev.x0[0])
    assert inp.endswith("....") and task.rescore(inp, out, out) == scores[0]
    assert task.rescore(inp, out[:4] + out[4:][::-1], None)["sorted_rate"] == float(out[4] == out[7])


def test_the_toy_task_reads_input_files_and_names_a_bad_line(tmp_path):
    task = SortDigits(SortConfig())
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("3141\n\n5926\n0000\n")
    chunks = list(task.read_inputs(str(good), 2))
    assert [c.start for c in chunks] == [0, 2] and chunks[0].x[1].tolist() == [5, 9, 2, 6, 2, 5, 6, 9]
    assert task.format_outputs(chunks[0], chunks[0].x) == "1134\n2569\n"
    bad.write_text("3141\n12a4\n")
    with pytest.raises(InputFileError, match="bad.txt:2: expected 4 digits"):
        list(task.read_inputs(str(bad), 2))


def test_an_entry_point_plugin_is_imported_with_tasks(tmp_path, monkeypatch):
    """An installed package's `rmdm_study.tasks` entry point: its module is imported and registers."""
    import importlib.metadata as md
    import sys

    (tmp_path / "sort_plugin_ep.py").write_text(
        f"from typing import Literal\nimport tasks\nfrom {__name__} import SortConfig, SortDigits\n\n"
        "class EpConfig(SortConfig):\n    name: Literal['sort_ep'] = 'sort_ep'\n\n"
        "class EpSort(SortDigits):\n    name = 'sort_ep'\n\n"
        "tasks.register(EpConfig, EpSort)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sort_plugin_ep", raising=False)
    eps = md.EntryPoints([md.EntryPoint("sort_ep", "sort_plugin_ep", tasks.PLUGIN_GROUP)])
    monkeypatch.setattr(md, "entry_points", lambda group=None: eps if group == tasks.PLUGIN_GROUP else [])
    try:
        tasks.load_plugins()
        assert tasks.task_class("sort_ep").__module__ == "sort_plugin_ep"
    finally:
        tasks.TASKS.pop("sort_ep", None)
