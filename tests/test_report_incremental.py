"""`study report` redraws only what changed (analysis/incremental.py): a second report of an unchanged study
redraws nothing, one after a new run redraws the figures that read its rows only, and what it leaves in the
folder is byte for byte what a full `--redraw` writes; a figure file changed or removed on disk is redrawn.

Run: .venv/bin/python -m pytest tests/test_report_incremental.py -q   (the analysis tests' store, real Parquet)
"""
from __future__ import annotations

import json
import os
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from analysis.incremental import INPUTS, MANIFEST, Keys, frame_digest, intact, read_manifest
from store import Store
from tests.test_analysis_data import TS, _write, eval_row, run_row, write_all

FIGURE_LINE = re.compile(r"^(\d+) figures: (\d+) redrawn, (\d+) unchanged(?:, (\d+) not drawn)?$", re.M)


@pytest.fixture
def results(tmp_path):
    root = str(tmp_path / "results")
    write_all(root)
    return root


def report(results: str, out, *extra: str) -> tuple[int, int, int]:
    """`study report --figure all` of the ablation study (Sudoku and text8 runs) into `out`: (figures, redrawn,
    unchanged) as it prints them."""
    from study.cli import app

    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", "all", "--results", results,
                                 "--out", str(out), "--jobs", "1", *extra])
    assert r.exit_code == 0, r.output
    got = FIGURE_LINE.findall(r.output)
    assert len(got) == 1, r.output
    n, redrawn, unchanged, missing = (int(v or 0) for v in got[0])
    assert n == redrawn + unchanged + missing
    return n, redrawn, unchanged


def add_run(results: str) -> None:
    """A second seed of the (1 x 3) trained with loss ALL: a Sudoku run, with its history."""
    run = run_row("ablation", "sudoku", {"n": 9, "mask_rate": 0.25}, 1, 3, loss="all", seed=1)
    _write(Store(results, "ablation"), run, [eval_row(run, T, 3, "vpr", v) for T, v in zip(TS, [0.62, 0.82, 0.9, 0.96])])


def files(folder) -> dict[str, bytes]:
    """Every file of the folder, the reports' minute of writing masked (the only thing two reports may differ by)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        data = open(os.path.join(folder, name), "rb").read()
        out[name] = re.sub(rb"\d{4}-\d\d-\d\d \d\d:\d\d UTC", b"<time>", data) if name.startswith("report.") else data
    return out


def test_an_incremental_report_is_a_full_redraw_byte_for_byte(results, tmp_path):
    inc, full = tmp_path / "inc", tmp_path / "full"
    n, drawn, _ = report(results, inc)
    assert drawn >= 5 and (inc / MANIFEST).is_file()
    first = read_manifest(str(inc))
    assert set(first) >= {"losses", "schedules", "text8", "training-curves"}
    before = files(inc)

    # unchanged: nothing redrawn, every file as it was
    assert report(results, inc) == (n, 0, drawn)
    assert read_manifest(str(inc)) == first and files(inc) == before

    add_run(results)  # a Sudoku run: the figures of the aggregated rows, runs or history change; text8's do not
    _, redrawn, unchanged = report(results, inc)
    second = read_manifest(str(inc))
    changed = {f for f in second if second[f]["key"] != first[f]["key"]}
    assert "text8" not in changed and {"losses", "schedules", "training-curves"} <= changed
    assert (redrawn, unchanged) == (len(changed), drawn - len(changed))
    assert second["text8"] == first["text8"]
    assert files(inc)["losses.png"] != before["losses.png"]  # the new seed is drawn

    # the same study drawn whole into another folder: the same files, byte for byte (manifest included)
    assert report(results, full, "--redraw") == (n, drawn, 0)
    assert files(inc) == files(full)


def test_a_figure_file_changed_or_removed_on_disk_is_redrawn(results, tmp_path):
    out = tmp_path / "figs"
    n, drawn, _ = report(results, out)
    good = (out / "losses.png").read_bytes()
    (out / "losses.png").write_bytes(good[:-10] + b"edited...!")  # same size, other bytes
    (out / "text8_table.csv").unlink()
    assert report(results, out) == (n, 2, drawn - 2)
    assert (out / "losses.png").read_bytes() == good and (out / "text8_table.csv").is_file()
    # --redraw draws every figure, whatever the manifest says
    assert report(results, out, "--redraw") == (n, drawn, 0)


def test_one_figure_keeps_the_others_entries_and_an_edited_manifest_is_not_trusted(results, tmp_path):
    from study.cli import app

    out = tmp_path / "figs"
    report(results, out)
    whole = read_manifest(str(out))
    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", "losses", "--results", results,
                                 "--out", str(out)])
    assert r.exit_code == 0 and "1 figure: 0 redrawn, 1 unchanged" in r.output, r.output
    assert read_manifest(str(out)) == whole
    # a manifest naming a file outside the folder: never read or copied, the figure is drawn
    assert not intact(str(out), {"key": "k", "files": [["../results/x.png", "0" * 64]]})
    text = json.loads((out / MANIFEST).read_text())
    text["figures"]["losses"]["files"][0][0] = os.path.join("..", "figs", "losses.png")
    (out / MANIFEST).write_text(json.dumps(text))
    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", "losses", "--results", results,
                                 "--out", str(out)])
    assert r.exit_code == 0 and "1 figure: 1 redrawn, 0 unchanged" in r.output, r.output


def test_keys_follow_the_options_and_every_figure_reads_known_inputs(results):
    from analysis.derived import Derived
    from analysis.figures import FIGURES, Options
    from analysis.load import load_study

    for name, fig in FIGURES.items():
        assert set(getattr(fig.module, "READS", INPUTS)) <= set(INPUTS), name
    data = load_study(results, "ablation")
    keys = lambda opts: {n: Keys(data, Derived(data), opts).key(n) for n in FIGURES}
    a, b = keys(Options()), keys(Options(fmt="pdf"))
    assert a == keys(Options()) and len(set(a.values())) == len(a)
    assert all(a[n] != b[n] for n in FIGURES)


def test_a_table_digest_reads_values_order_and_lists():
    df = pd.DataFrame({"a": [1, 2], "b": [[1.0, 2.0], [3.0]], "c": ["x", None]})
    d = frame_digest(df)
    assert d == frame_digest(df.copy()) and d != frame_digest(df.iloc[::-1])
    assert d != frame_digest(df.assign(b=[[1.0, 2.0], [3.5]])) and d != frame_digest(df.assign(c=["x", "y"]))
    assert frame_digest(None) != frame_digest(b"") != frame_digest(df.iloc[:0])


def _counting(monkeypatch) -> dict[str, int]:
    """Every figure of the registry wrapped to count its calls (the reports below draw in this process: --jobs 1)."""
    from analysis import figures as registry

    calls = {n: 0 for n in registry.FIGURES}

    def counted(name, fig):
        def call(*args, **kwargs):
            calls[name] += 1
            return fig(*args, **kwargs)
        return call

    monkeypatch.setattr(registry, "FIGURES", {n: counted(n, f) for n, f in registry.FIGURES.items()})
    return calls


def _said(results: str, out) -> tuple[list[str], str]:
    """(the 'not drawn' lines of `study report --figure all` into `out`, its whole output)."""
    from study.cli import app

    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", "all", "--results", results,
                                 "--out", str(out), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    return [line for line in r.output.splitlines() if ": not drawn: " in line], r.output


def test_a_figure_the_data_cannot_support_is_not_called_again_until_its_rows_change(results, tmp_path, monkeypatch):
    from analysis.incremental import read_not_drawn

    out = tmp_path / "figs"
    first, whole = _said(results, out)
    recorded = read_not_drawn(str(out))
    assert first and sorted(recorded) == sorted(line.split(":")[0] for line in first)
    assert {"mask-rate", "tuning", "ladder"} <= set(recorded) and not set(recorded) & set(read_manifest(str(out)))
    md = files(out)["report.md"]

    calls = _counting(monkeypatch)
    again, _ = _said(results, out)
    assert again == first  # the same messages, in the same order
    assert all(calls[n] == 0 for n in recorded), calls  # said again from the manifest, never called
    assert sum(calls.values()) == 0 and files(out)["report.md"] == md
    assert read_not_drawn(str(out)) == recorded

    # a new Sudoku run changes the aggregated rows and the runs: the figures reading them are tried again; tuning
    # (the Optuna storage's bytes only) is not
    add_run(results)
    _said(results, out)
    changed = {n for n, e in read_not_drawn(str(out)).items() if recorded.get(n, {}).get("key") != e["key"]}
    assert {"mask-rate", "ladder"} <= changed and "tuning" not in changed
    assert calls["mask-rate"] == 1 and calls["ladder"] == 1 and calls["tuning"] == 0, calls

    # --redraw calls every figure, those not drawn included
    before = dict(calls)
    report(results, out, "--redraw")
    assert all(calls[n] == before[n] + 1 for n in calls), calls


def test_a_not_drawn_figure_is_tried_again_for_another_study_folder_or_an_edited_record(results, tmp_path, monkeypatch):
    import shutil

    from analysis.incremental import read_not_drawn

    out = tmp_path / "figs"
    first, _ = _said(results, out)
    calls = _counting(monkeypatch)
    # the same rows under another results folder: the same keys, but a message may name the folder (tuning's does)
    moved = str(tmp_path / "elsewhere")
    shutil.copytree(results, moved)
    lines, _ = _said(moved, out)
    assert all(calls[n] == 1 for n in read_not_drawn(str(out))), calls
    assert any(moved in line for line in lines) and not any(results + os.sep in line for line in lines)
    # a record whose message is not text, or whose key is not the figure's, is not said: the figure is called
    text = json.loads((out / MANIFEST).read_text())
    text["not_drawn"]["tuning"]["why"] = ["not", "text"]
    text["not_drawn"]["ladder"]["key"] = "0" * 64
    (out / MANIFEST).write_text(json.dumps(text))
    _said(moved, out)
    assert calls["tuning"] == 2 and calls["ladder"] == 2 and calls["mask-rate"] == 1, calls


def test_nothing_left_to_draw_pickles_nothing_and_starts_no_worker(results, tmp_path, monkeypatch):
    from analysis import render
    from analysis.derived import Derived
    from analysis.load import load_study
    from analysis.options import Options
    from study.cli import app

    out = tmp_path / "figs"
    first, _ = _said(results, out)

    def refuse(*args, **kwargs):
        raise AssertionError("the study pickled or a worker started with nothing to draw")

    monkeypatch.setattr(render.pickle, "dump", refuse)
    monkeypatch.setattr(render, "ProcessPoolExecutor", refuse)
    # a re-run asking for workers: every figure kept or said again, none sent to a worker
    r = CliRunner().invoke(app, ["report", "--study", "ablation", "--figure", "all", "--results", results,
                                 "--out", str(out), "--jobs", "4"])
    assert r.exit_code == 0, r.output
    assert [line for line in r.output.splitlines() if ": not drawn: " in line] == first
    data = load_study(results, "ablation")
    empty, said = tmp_path / "empty", []
    empty.mkdir()
    assert render.draw(data, [], str(empty), Options(), jobs=4, derived=Derived(data),
                       meanwhile=lambda: said.append(1)) == {}
    assert said == [1] and os.listdir(empty) == []


def test_a_reused_figures_derived_tables_are_read_back_exactly_not_computed_again(tmp_path, monkeypatch):
    from pandas.testing import assert_frame_equal

    import analysis.derived as derived_module
    from analysis.derived import Computed, Derived
    from analysis.incremental import KEPT, load_derived, read_not_drawn
    from analysis.load import load_study
    from analysis.options import Options
    from study.cli import app
    from tests.test_effective_params import write_study

    root, out = str(tmp_path / "res"), tmp_path / "rep"
    write_study(root, "eff")  # effective parameters and threshold crossings both computed
    run = lambda: CliRunner().invoke(app, ["report", "--study", "eff", "--figure", "all", "--results", root,
                                           "--out", str(out), "--jobs", "1"])
    r = run()
    assert r.exit_code == 0, r.output
    first, md = r.output, files(out)["report.md"]
    entries = {**read_not_drawn(str(out)), **read_manifest(str(out))}
    assert all(entries[n]["derived"]["what"] == what for n, what in KEPT.items())
    # what is read back is what a fresh computation gives, exactly (dtypes included)
    data, opts = load_study(root, "eff"), Options()
    got, fresh = Computed(), Derived(data)
    assert all(load_derived(str(out), n, entries[n]["key"], entries[n]["derived"], got, opts) for n in KEPT)
    # a record under another key is not read (the figure's key covers what the tables are computed from)
    assert not load_derived(str(out), "pareto", "0" * 64, entries["pareto"]["derived"], Computed(), opts)
    key = (opts.threshold, opts.pareto_x, opts.split)
    assert_frame_equal(got.crossings[key], fresh.crossings(*key), check_exact=True)
    for part in ("table", "curves", "beta"):
        assert_frame_equal(getattr(got.effective["test"], part), getattr(fresh.effective("test"), part),
                           check_exact=True)
    assert got.effective["test"].skipped == fresh.effective("test").skipped

    calls = {"effective": 0, "crossings": 0}

    def counting(what, f):
        def call(*args, **kwargs):
            calls[what] += 1
            return f(*args, **kwargs)
        return call

    monkeypatch.setattr(derived_module, "effective_params", counting("effective", derived_module.effective_params))
    monkeypatch.setattr(Derived, "_crossings", counting("crossings", Derived._crossings))
    r = run()
    assert r.exit_code == 0 and calls == {"effective": 0, "crossings": 0}, calls
    assert files(out)["report.md"] == md
    assert [line for line in r.output.splitlines() if "figures:" not in line] == \
        [line for line in first.splitlines() if "figures:" not in line]

    # a kept file changed on disk is not read: the tables are computed again (the same report) and kept again
    bad = out / ".derived.effective-params.table.parquet"
    good = bad.read_bytes()
    bad.write_bytes(good[:-4] + b"PAR0")
    r = run()
    assert r.exit_code == 0 and calls == {"effective": 1, "crossings": 0}, calls
    assert files(out)["report.md"] == md and bad.read_bytes() == good
    run()
    assert calls == {"effective": 1, "crossings": 0}, calls


def test_a_derived_table_parquet_does_not_keep_exactly_is_not_kept(tmp_path):
    from analysis.derived import Computed
    from analysis.incremental import keep_derived
    from analysis.options import Options

    opts = Options()
    computed = Computed(crossings={(opts.threshold, opts.pareto_x, opts.split):
                                   pd.DataFrame({"a": [1, 2], "b": [[1.0], [2.0, 3.0]]})})  # lists: arrays back
    assert keep_derived(str(tmp_path), "pareto", "k", computed, opts) is None and os.listdir(tmp_path) == []
    computed.crossings[(opts.threshold, opts.pareto_x, opts.split)] = pd.DataFrame({"a": [1, 2], "b": ["x", None]})
    kept = keep_derived(str(tmp_path), "pareto", "k", computed, opts)
    assert kept["what"] == "crossings" and kept["key"] == "k"
    assert [f for f, _ in kept["files"]] == [".derived.pareto.crossings.parquet"]
    assert keep_derived(str(tmp_path), "effective-params", "k", computed, opts) is None  # none computed
