"""Command-line overrides (study/spec/overrides.py): `study plan|run|status|tune GRID key=value ...`, applied
to the grid's mapping before the file's own strict validation, and recorded in the study's grid.
The real CLI (typer's CliRunner on `study.cli.app`, a `study` subprocess for the trained run).
Run: pytest tests/test_overrides.py"""
from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from study.cli import app
from study.spec.grid import GridError, load_grid
from tests.helpers import ROOT, study, tiny_grid


def cli(*args: str):
    r = CliRunner().invoke(app, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in r.output, r.output
    return r


def plan_ids(*args: str) -> dict[str, int]:
    """run id -> L_t of `study plan ARGS --json`."""
    r = cli("plan", *args, "--json")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {row["run_id"]: row["L_t"] for row in rows if not row.get("totals")}


def fails(*args: str, words: tuple[str, ...]) -> str:
    """`study ARGS` is a user mistake: exit 2, one line, naming `words`."""
    r = cli(*args)
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture
def grid(tmp_path) -> str:
    p = tmp_path / "g.yaml"
    p.write_text(tiny_grid("ov"))  # axes L: [1, 2], train.steps 20, eval.T [1, 2]
    return str(p)


def test_ids_change_exactly_where_training_changes(grid):
    base = plan_ids(grid)
    assert sorted(base.values()) == [1, 2]
    # a training field of every run: every id changes, as many runs
    steps = plan_ids(grid, "train.steps=30")
    assert len(steps) == 2 and not set(steps) & set(base)
    assert plan_ids(grid, "steps=30") == steps  # the short name is the same field
    # eval-only: no id changes
    assert plan_ids(grid, "eval.T=[1,2,3]") == base
    assert plan_ids(grid, "task.n_test=8", "eval.n_examples=8") == base  # the evaluation set only
    # an axis: the L=1 run keeps its id, L=2 is gone, L=3 is new
    ax = plan_ids(grid, "axes.L=[1,3]")
    keep = {i for i, L in base.items() if L == 1}
    assert set(ax) & set(base) == keep and sorted(ax.values()) == [1, 3]
    # a field the grid varies as an axis is set through it: `L=[...]`, `model.L=[...]`, `L=3`
    assert plan_ids(grid, "L=[1,3]") == ax == plan_ids(grid, "model.L=[1,3]")
    assert sorted(plan_ids(grid, "L=2").items()) == [(i, 2) for i, L in base.items() if L == 2]
    # several at once, in order; a value that changes nothing changes no id
    assert plan_ids(grid, "train.steps=20", "eval.T=[1,2]") == base


def test_unknown_key_and_bad_value_are_one_line_naming_the_override(grid):
    line = fails("plan", grid, "train.stepz=10", words=("override train.stepz=10", "unknown key", "steps", "lr"))
    assert "allowed:" in line
    fails("run", grid, "foo=1", words=("override foo=1", "unknown key", "axes", "train"))
    fails("status", grid, "train.steps=abc", words=("override train.steps=abc", "train.steps", "integer"))
    fails("tune", grid, "model.d_model=1000000", words=("override model.d_model=1000000", "bound"))
    fails("plan", grid, "axes.L=5", words=("override axes.L=5", "non-empty list"))
    fails("plan", grid, "task.mask_rate=true", words=("override task.mask_rate=true", "boolean"))
    # the same error the file gives, with the override named instead of the file
    file_err = str(pytest.raises(GridError, load_grid, _write(grid, "stepz: 10")).value)
    assert file_err.split(": key ", 1)[1] in line
    # malformed overrides
    fails("plan", grid, "train.steps=[1", words=("override train.steps=[1", "not valid YAML"))
    fails("plan", grid, "train.steps", words=("override train.steps", "KEY=VALUE"))
    fails("plan", grid, "a..b=1", words=("override a..b=1", "not a key"))
    fails("plan", grid, "train.steps=1\n#x", words=("override train.steps=1\\n#x", "control character"))
    fails("plan", grid, "train.steps.x=1", words=("train.steps is 20", "not a mapping"))
    fails("plan", grid, "groups.0.train.steps=1", words=("no list groups",))
    fails("plan", grid, "train.steps=10", "steps=20", words=("again",))
    fails("plan", grid, "study=../x", words=("override study=../x", "plain name"))  # never escapes the store
    fails("plan", grid, "eval.T=!!python/object:os.system [1]", words=("not valid YAML",))  # safe_load only


def _write(grid: str, train_line: str) -> str:
    """A copy of `grid` whose train section also holds `train_line`."""
    text = open(grid).read().replace("train: {steps: 20,", "train: {" + train_line + ", steps: 20,")
    p = os.path.join(os.path.dirname(grid), "file.yaml")
    with open(p, "w") as f:
        f.write(text)
    return p


def test_add_and_delete(grid):
    base = plan_ids(grid)
    assert plan_ids(grid, "+train.lr=0.01") != base  # a key the file lacks
    fails("plan", grid, "+train.steps=3", words=("+train.steps=3", "already sets train.steps", "train.steps=VALUE"))
    fails("plan", grid, "~train.lr", words=("~train.lr", "does not set train.lr"))
    fails("plan", grid, "~train.steps=3", words=("takes no value",))
    # deleting falls back to the schema's default, exactly as a file without the key
    assert plan_ids(grid, "~train.warmup") == plan_ids(_write_without(grid, " warmup: 2,"))
    only1 = plan_ids(grid, "~axes.L")
    assert list(only1.values()) == [1] and set(only1) <= set(base)


def _write_without(grid: str, part: str) -> str:
    p = os.path.join(os.path.dirname(grid), "without.yaml")
    with open(p, "w") as f:
        f.write(open(grid).read().replace(part, ""))
    return p


def test_groups_and_shadowed_fields(tmp_path):
    p = tmp_path / "gg.yaml"
    p.write_text(tiny_grid("ovg", axes="seed: [0]").replace("axes:\n  seed: [0]\n", "")
                 + "groups:\n  - {name: a, axes: {L: [1, 2]}}\n  - {name: b, train: {steps: 7}, axes: {K: [1]}}\n")
    g = str(p)
    base = plan_ids(g)
    assert len(base) == 3
    # a top-level value that group b sets again would not reach b's run: refused, naming where to override
    fails("plan", g, "train.steps=30", words=("override train.steps=30", "groups[1].train.steps",
                                              "groups.1.train.steps"))
    fails("plan", g, "model.L=3", words=("groups[0].axes.L", "groups.0.axes.L=[...]"))
    one = plan_ids(g, "groups.1.train.steps=30")  # only group b's run changes
    assert len(set(one) & set(base)) == 2 and len(one) == 3
    assert plan_ids(g, "groups[1].train.steps=30") == one
    two = plan_ids(g, "groups.0.axes.L=[2]")  # group a's L=1 run is gone, nothing new
    assert len(two) == 2 and set(two) < set(base)
    fails("plan", g, "groups.5.train.steps=1", words=("past its end",))
    fails("plan", g, "groups.1.train.stepz=1", words=("override groups.1.train.stepz=1", "unknown key"))


def test_defaults_from_wins_so_its_fields_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # defaults_from paths are relative to the working directory
    (tmp_path / "best.yaml").write_text("kind: rmdm-study/best-values\nsplit: val\nstudy: t\n"
                                        "groups:\n  t: {point: {}, best: {train.lr: 0.01}}\n")
    p = tmp_path / "g.yaml"
    p.write_text(tiny_grid("ovd") + "defaults_from: {file: best.yaml, group: t}\n")
    fails("plan", str(p), "train.lr=0.1", words=("override train.lr=0.1", "defaults_from", "best.yaml"))
    assert len(plan_ids(str(p), "train.steps=30")) == 2
    assert len(plan_ids(str(p), "~defaults_from", "train.lr=0.1")) == 2


def test_lease_check_reads_the_overridden_study_name():
    from study.spec.overrides import study_name

    assert study_name({"study": "a"}, ["study=b"]) == "b"
    assert study_name({"study": "a"}, ["~study"]) is None
    assert study_name({"study": "a"}, ["train.steps=3"]) == "a"


# slow set (19 s of the default suite, measured under load); the default suite keeps test_ids_change_exactly_where_training_changes
@pytest.mark.slow
def test_overrides_recorded_in_the_stored_grid(tmp_path):
    """A real tiny `study run` with overrides: grid.yaml and the provenance copy hold the grid as applied
    with the overrides named; `study report --figure all` shows them; the file's grid without the
    overrides names other runs, which `study status` shows as not done (nothing silently reused)."""
    gpath = tmp_path / "g.yaml"
    gpath.write_text(tiny_grid("ovrun", steps=20))
    results = str(tmp_path / "results")
    ov = ("train.steps=10", "L=[1]")
    r = study("run", str(gpath), *ov, "--results", results, "--num-cpus", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    stored = open(os.path.join(results, "ovrun", "grid.yaml")).read()
    assert "# " + str(gpath) + " with command-line overrides" in stored
    assert "#   train.steps=10\n#   L=[1]\n" in stored
    import yaml

    raw = yaml.safe_load(stored)
    assert raw["train"]["steps"] == 10 and raw["axes"] == {"L": [1]}
    prov = os.path.join(results, "ovrun", "grids")
    if os.path.exists(os.path.join(ROOT, "store", "provenance.py")):  # every grid run, by content hash
        copies = [open(os.path.join(prov, f)).read() for f in os.listdir(prov) if f.endswith(".yaml")]
        assert stored in copies
    # status: with the overrides every run is done; the file alone asks for other, untrained runs
    with_ov = [json.loads(x) for x in
               cli("status", str(gpath), *ov, "--results", results, "--json").stdout.splitlines()]
    assert [s["state"] for s in with_ov] == ["done"]
    r = cli("status", str(gpath), "--results", results, "--json")
    plain = [json.loads(x) for x in r.stdout.splitlines()]
    assert "last run with overrides: train.steps=10 L=[1]; now: none" in r.stderr  # said, not silent
    assert "note:" not in cli("status", str(gpath), *ov, "--results", results).stderr
    assert len(plain) == 2 and not {s["run_id"] for s in plain} & {s["run_id"] for s in with_ov}
    assert all(s["state"] != "done" for s in plain)
    v = cli("verify", "--study", "ovrun", "--results", results)  # the stored grid, header and all, re-expands
    assert v.exit_code == 0, v.output
    r = study("report", "--figure", "all", "--study", "ovrun", "--results", results)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    md = open(os.path.join(results, "ovrun", "figures", "report.md")).read()
    assert "train.steps=10" in md and "L=[1]" in md and "command-line overrides" in md


def test_a_bad_value_for_a_field_a_couple_sets_is_named_before_the_couple():
    """`model.K=abc` on a grid whose couple sets K (issue 44: only the coupling was named): the value first."""
    grid = os.path.join(ROOT, "grids", "first_study.yaml")
    fails("plan", grid, "model.K=abc", words=("model.K=abc", "valid integer", "(got 'abc')"))
    fails("plan", grid, "model.K=3", words=("couple[0][0] sets model.K",))
