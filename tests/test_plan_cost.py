"""`study plan`: what a grid will cost (training and evaluation FLOPs, time, a step's peak memory)
and the warning when an eval T exceeds the free positions.

Run: .venv/bin/python -m pytest tests/test_plan_cost.py -q   (the --measure tests start a child
process that trains a few steps; the memory comparison is `-m slow`)
"""
from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from model import RecursiveDenoiser, SeqSpec
from model.costs import depth_at, loop_weights
from study.cli import app
from study.spec.grid import load_grid
from tasks import make_task

GRID = {
    "study": "cost",
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 20, "n_test": 6},
    "model": {"d_model": 16, "n_heads": 2},
    "train": {"steps": 30, "batch_size": 4},
    "eval": {"T": [1, 3], "L_s": ["train", 1], "n_examples": 10,
             "adaptive": [{"max_loops": 3, "threshold": 0.9}]},
    "groups": [
        {"name": "fixed", "axes": {"K": [1, 2], "L": [1, 3]}, "train": {"loss": "final"}},
        # a stochastic schedule draws each step's depth from the seed: seeds must not share a count
        {"name": "stoch", "model": {"L": 3}, "train": {"schedule": "stochastic"}, "axes": {"seed": [0, 1]}},
    ],
}
BASE = {k: v for k, v in GRID.items() if k != "groups"}


def plan(tmp_path, raw: dict, *args: str):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = CliRunner().invoke(app, ["plan", str(path), *args])
    return r, path


def json_rows(r) -> tuple[list[dict], dict]:
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1].get("totals") is True and not any(x.get("totals") for x in lines[:-1])
    return lines[:-1], lines[-1]


def own_counts(run) -> tuple[int, int]:
    """Training and evaluation FLOPs from the run's own model (built for real), step by step."""
    task = make_task(run.task)
    model = RecursiveDenoiser(run.model, SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes()))
    train = 0
    for step in range(run.train.steps):
        d = depth_at(step, run.train.steps, run.model.L, run.train)
        heads = d if any(w > 0 for w in loop_weights(d, run.train)[:-1]) else 1  # loss on earlier loops
        train += run.train.batch_size * 3 * model.flops_per_forward(d, heads=heads)
    n = min(run.eval.n_examples, run.task.n_test)
    ev = 0
    for pt in run.eval_points():
        heads = pt.L_s if pt.adaptive is not None else 1  # adaptive depth reads the head every loop
        ev += n * pt.T * model.flops_per_forward(pt.L_s, heads=heads)
    return train, ev


def test_plan_flop_totals_are_the_models_own_counts(tmp_path):
    r, path = plan(tmp_path, GRID, "--json")
    rows, totals = json_rows(r)
    runs = {run.run_id: run for run in load_grid(str(path)).runs}
    assert len(rows) == len(runs) == 6
    want_train = want_eval = 0
    for row in rows:
        train, ev = own_counts(runs[row["run_id"]])
        assert (row["train_flops"], row["eval_flops"]) == (train, ev), row["run_id"]
        want_train += train
        want_eval += ev
    assert (totals["train_flops"], totals["eval_flops"], totals["runs"]) == (want_train, want_eval, 6)
    stoch = [row["train_flops"] for row in rows if row["schedule"] == "stochastic"]
    assert len(set(stoch)) == 2  # two seeds, two depth draws
    assert totals["seconds"] is None and all(row["seconds"] is None for row in rows)  # no rate given
    assert all(row["memory_how"] == "estimate" and row["memory_bytes"] > 0 for row in rows)
    # the text form prints the same totals
    text = CliRunner().invoke(app, ["plan", str(path)])
    assert text.exit_code == 0 and f"total: {want_train:.3g} training FLOPs, {want_eval:.3g} evaluation" in text.stdout


def test_a_given_rate_gives_time_as_flops_over_rate(tmp_path):
    rows, totals = json_rows(plan(tmp_path, GRID, "--json", "--flops-per-s", "2e9")[0])
    for row in rows:
        assert row["seconds"] == pytest.approx((row["train_flops"] + row["eval_flops"]) / 2e9)
        assert row["train_seconds"] == pytest.approx(row["train_flops"] / 2e9)
    assert totals["seconds"] == pytest.approx((totals["train_flops"] + totals["eval_flops"]) / 2e9)
    rows, totals = json_rows(plan(tmp_path, GRID, "--json", "--mfu", "0.5", "--device", "h100")[0])
    assert totals["seconds"] == pytest.approx((totals["train_flops"] + totals["eval_flops"]) / (0.5 * 989e12))
    rows, totals = json_rows(plan(tmp_path, GRID, "--json", "--mfu", "0.5", "--peak-flops", "1e12")[0])
    assert totals["seconds"] == pytest.approx((totals["train_flops"] + totals["eval_flops"]) / 0.5e12)


@pytest.mark.parametrize("args, words", [
    (["--mfu", "0.4"], "--device NAME or --peak-flops"),
    (["--device", "h100"], "need --mfu"),
    (["--mfu", "0.4", "--device", "tpu9"], "known devices: "),
    (["--flops-per-s", "1e12", "--mfu", "0.4"], "either --flops-per-s"),
    (["--flops-per-s", "0"], "must be > 0"),
    (["--mfu", "1.5", "--device", "a100"], "(0, 1]"),
])
def test_bad_rate_options_fail_in_one_line(tmp_path, args, words):
    r, _ = plan(tmp_path, GRID, *args)
    assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("T, warned", [([2, 6], False), ([7], True)])
def test_plan_warns_when_T_exceeds_the_free_positions(tmp_path, T, warned):
    """4x4 Sudoku at mask_rate 0.4 blanks round(0.4 * 16) = 6 cells: T = 7 leaves a step with nothing to do."""
    raw = {**BASE, "eval": {"T": T, "L_s": ["train"]}}
    for args in ([], ["--json"]):
        r, _ = plan(tmp_path, raw, *args)
        assert r.exit_code == 0, r.output
        lines = [x for x in r.stderr.splitlines() if "free (masked) positions" in x]
        if warned:
            assert len(lines) == 1 and "T=7" in lines[0] and "the 6 free" in lines[0], r.stderr
        else:
            assert lines == [], r.stderr
        if args:
            json_rows(r)  # stdout stays JSON lines


def test_countdown_free_positions_are_the_output_part(tmp_path):
    """Countdown-3 at the default field width: 28 output positions (issue 12's example)."""
    raw = {"study": "cd", "task": {"name": "countdown", "n_operands": 3}, "model": {"d_model": 16, "n_heads": 2},
           "eval": {"T": [28, 40], "L_s": ["train"]}}
    r, _ = plan(tmp_path, raw)
    lines = [x for x in r.stderr.splitlines() if "free (masked) positions" in x]
    assert len(lines) == 1 and "T=40 exceeds the 28 free" in lines[0] and "28," not in lines[0], r.stderr


def test_measure_times_each_shape_once_and_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RMDM_CACHE_DIR", str(tmp_path / "cache"))
    raw = {**BASE, "axes": {"seed": [0, 1]}, "eval": {"T": [2], "L_s": ["train"]}}
    rows, totals = json_rows(plan(tmp_path, raw, "--json", "--measure")[0])
    assert len(rows) == 2
    cache_file = tmp_path / "cache" / "throughput.json"
    cached = json.loads(cache_file.read_text())
    assert list(cached["shapes"]) and len(cached["shapes"]) == 1  # two seeds, one shape: measured once
    entry = next(iter(cached["shapes"].values()))
    assert entry["train"] > 0 and entry["eval"] > 0 and entry["memory"] > 0
    for row in rows:
        assert row["memory_how"].startswith("measured") and row["memory_bytes"] == entry["memory"]
        assert row["seconds"] == pytest.approx(row["train_flops"] / entry["train"] + row["eval_flops"] / entry["eval"])
    # the second plan reads the cache: rates planted in the file come back in its times
    for e in cached["shapes"].values():
        e.update(train=1e6, eval=2e6, memory=12345)
    cache_file.write_text(json.dumps(cached))
    rows, totals = json_rows(plan(tmp_path, raw, "--json", "--measure")[0])
    for row in rows:
        assert row["seconds"] == pytest.approx(row["train_flops"] / 1e6 + row["eval_flops"] / 2e6)
        assert row["memory_bytes"] == 12345
    assert json.loads(cache_file.read_text()) == cached  # nothing measured again


@pytest.mark.slow
def test_memory_estimate_is_near_a_measured_step(tmp_path, monkeypatch):
    """The estimate's constant against a real step (9x9 Sudoku, d 64, 2 x 3, batch 32, float32)."""
    monkeypatch.setenv("RMDM_CACHE_DIR", str(tmp_path / "cache"))
    raw = {"study": "mem", "task": {"name": "sudoku", "n": 9, "n_train": 20, "n_test": 4},
           "model": {"d_model": 64, "n_heads": 4, "K": 2, "L": 3, "attention": "sdpa"},
           "train": {"steps": 10, "batch_size": 32, "precision": "float32"}, "eval": {"T": [1]}}
    (est,), _ = json_rows(plan(tmp_path, raw, "--json")[0])
    (got,), _ = json_rows(plan(tmp_path, raw, "--json", "--measure")[0])
    assert 0.8 < got["memory_bytes"] / est["memory_bytes"] < 1.25, (got["memory_bytes"], est["memory_bytes"])
