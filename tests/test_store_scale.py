"""The store's read index (store/index.py): the same rows as reading every file, nothing read twice,
changes and new writes seen, a damaged or half-written index harmless, damaged files still named.

Run: pytest tests/test_store_scale.py -q   (real Parquet files on a local disk; a second)
"""
from __future__ import annotations

import os

import pandas as pd
import pyarrow as pa

from store import SCHEMAS, Store, index
from tests.helpers import full_row

N_RUNS, KEYS = 20, ("T1_a", "T2_a")
OLD = 1_600_000_000  # file mtimes are set explicitly (never the clock): older than the newest file by far


def rows_of(rid: str, status: str = "done") -> dict:
    return {"runs": [full_row("runs", run_id=rid, study="s", task="sudoku", K=1, L_t=1, status=status)],
            "history": [full_row("history", run_id=rid, step=s, loss=1.0 / (s + 1), L_t=1) for s in range(3)]}


def write_run(store: Store, rid: str, value: float, output: str) -> None:
    """Every table's files of one done run: its row, history, and an evals and a samples file per KEYS."""
    r = rows_of(rid)
    store.write_rows("runs", r["runs"], f"{rid}.parquet")
    store.write_rows("history", r["history"], f"{rid}.parquet")
    for k in KEYS:
        store.write_rows("evals", [full_row("evals", run_id=rid, eval_key=k, metric="vpr", value=value)],
                         rid, f"{k}.parquet")
        store.write_rows("samples", [full_row("samples", run_id=rid, eval_key=k, example=0, output=output)],
                         rid, f"{k}.parquet")


def build(tmp_path) -> Store:
    store = Store(str(tmp_path / "results"), "s")
    for i in range(N_RUNS):
        write_run(store, f"r{i:02d}", i / 100, "1234")
    age_all(store, OLD)
    return store


def age_all(store: Store, mtime: int, newest: int | None = None) -> None:
    """Every file written at `mtime`, but the last run's at `newest` (the newest a listing sees)."""
    newest = mtime + 100 if newest is None else newest
    for d, _, files in os.walk(store.dir):
        for f in files:
            t = newest if f"r{N_RUNS - 1:02d}" in os.path.join(d, f) else mtime
            os.utime(os.path.join(d, f), (t, t))


def reference(store: Store, table: str) -> pd.DataFrame:
    """Every file parsed one by one, in path order: what a read must equal."""
    tables = [t for t in (store.read_file(table, *os.path.relpath(i.path, f"{store.dir}/{table}").split("/"))
                          for i in index.list_files(store, table)) if t is not None]
    return pa.concat_tables(tables).to_pandas()


def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))


def test_indexed_reads_equal_reading_every_file(tmp_path):
    store = build(tmp_path)
    for table in ("runs", "evals", "history"):
        cold = store.read(table)  # parses every file, writes the index
        assert store.exists(f"{store.dir}/_index/{table}.parquet")
        warm = Store(store.root, "s").read(table)  # from the index
        same(cold, reference(store, table))
        same(warm, reference(store, table))
    assert len(store.read("evals")) == N_RUNS * len(KEYS)


def test_changed_new_and_deleted_files_after_indexing(tmp_path):
    store = build(tmp_path)
    store.read("runs"), store.read("evals"), store.summary()
    # a rerun rewrites one row, a new run appears, one file disappears; all written after the index
    store.write_rows("runs", rows_of("r00", status="failed")["runs"], "r00.parquet")
    store.write_rows("runs", rows_of("r99")["runs"], "r99.parquet")
    store.write_rows("evals", [full_row("evals", run_id="r99", eval_key="T1_a", metric="vpr", value=0.5)],
                     "r99", "T1_a.parquet")
    store.delete(store.path("runs", "r05.parquet"))
    for s in (store, Store(store.root, "s")):
        runs = s.read("runs")
        assert sorted(runs["run_id"]) == sorted({f"r{i:02d}" for i in range(N_RUNS)} - {"r05"} | {"r99"})
        assert runs.set_index("run_id").loc["r00", "status"] == "failed"  # the new version, once
        same(runs, reference(s, "runs"))
        evals = s.read("evals")
        assert len(evals) == N_RUNS * len(KEYS) + 1 and not evals.duplicated(["run_id", "eval_key"]).any()
        seen = s.summary()
        assert seen.run_row("r00")["status"] == "failed" and seen.run_row("r05") is None
        assert seen.eval_keys("r99") == {"T1_a"}


def test_a_file_rewritten_in_the_same_mtime_granule_is_never_taken_from_the_index(tmp_path):
    """Racy entries: a file as new as the newest of its listing is not indexed, so a rewrite with the
    same size and the same mtime (possible within 1 s on S3) is read in its new version."""
    store = build(tmp_path)
    age_all(store, OLD + 100, OLD + 100)  # every file equally new: none older than the newest by RACY_S
    assert sorted(store.read("evals")["value"]) == sorted(i / 100 for i in range(N_RUNS) for _ in KEYS)
    path = store.path("evals", "r03", "T1_a.parquet")
    size = os.path.getsize(path)
    store.write_rows("evals", [full_row("evals", run_id="r03", eval_key="T1_a", metric="vpr", value=0.77)],
                     "r03", "T1_a.parquet")
    os.utime(path, (OLD + 100, OLD + 100))
    assert os.path.getsize(path) == size  # the same identity as the version read before
    got = Store(store.root, "s").read("evals").set_index(["run_id", "eval_key"])
    assert got.loc[("r03", "T1_a"), "value"] == 0.77


def test_sub_second_mtimes_index_all_but_the_last_moments_and_still_see_a_racy_rewrite(tmp_path):
    """A store whose mtimes carry fractions of a second (a local disk) has a fine clock: files older
    than the newest by more than FINE_RACY_S are indexed, not only those two seconds older; a file
    within that window is read again, so its rewrite with the same size and mtime is seen."""
    store = build(tmp_path)
    newest_ns = OLD * 10**9 + 500_000_000
    racy_ns = newest_ns - int(index.FINE_RACY_S * 1e9) // 2  # inside the fine window
    settled_ns = newest_ns - int(0.2 * 1e9)  # 0.2 s older: outside it, though not 2 s older
    for d, _, files in os.walk(store.dir):
        for f in files:
            p = os.path.join(d, f)
            t = newest_ns if f"r{N_RUNS - 1:02d}" in p else racy_ns if "r03" in p else settled_ns
            os.utime(p, ns=(t, t))
    assert index.racy_window(index.list_files(store, "evals")) == (newest_ns, index.FINE_RACY_S)
    assert sorted(store.read("evals")["value"]) == sorted(i / 100 for i in range(N_RUNS) for _ in KEYS)
    idx = pd.read_parquet(f"{store.dir}/_index/evals.parquet")
    indexed = {f.split("/")[0] for f in idx["_file"]}
    assert indexed == {f"r{i:02d}" for i in range(N_RUNS)} - {"r03", f"r{N_RUNS - 1:02d}"}
    path = store.path("evals", "r03", "T1_a.parquet")
    size = os.path.getsize(path)
    store.write_rows("evals", [full_row("evals", run_id="r03", eval_key="T1_a", metric="vpr", value=0.77)],
                     "r03", "T1_a.parquet")
    os.utime(path, ns=(racy_ns, racy_ns))
    assert os.path.getsize(path) == size  # the same identity as the version read before
    got = Store(store.root, "s").read("evals").set_index(["run_id", "eval_key"])
    assert got.loc[("r03", "T1_a"), "value"] == 0.77
    # whole-second mtimes (S3, FAT): the coarse window
    age_all(store, OLD)
    assert index.racy_window(index.list_files(store, "evals"))[1] == index.RACY_S


def test_damaged_or_half_written_index_is_harmless(tmp_path):
    store = build(tmp_path)
    want = {t: reference(store, t) for t in ("runs", "evals", "history")}
    store.summary()
    idx = f"{store.dir}/_index"
    # a writer killed mid-write leaves a temp file; a damaged index is garbage or truncated
    with open(f"{idx}/.runs.parquet.deadbeef.tmp", "wb") as f:
        f.write(b"PAR1 half")
    with open(f"{idx}/evals.parquet", "wb") as f:
        f.write(b"not parquet at all")
    with open(f"{idx}/history.parquet", "r+b") as f:
        f.truncate(os.path.getsize(f"{idx}/history.parquet") // 2)
    fresh = Store(store.root, "s")
    for t, df in want.items():
        same(fresh.read(t), df)
    assert not fresh.unreadable  # the index is a cache, never a table file to report


def test_summary_agrees_with_per_file_reads_and_names_damaged_files(tmp_path):
    store = build(tmp_path)
    store.summary()  # index everything first: damage after indexing must still be seen
    for table, parts in (("runs", ["r01.parquet"]), ("evals", ["r02", "T1_a.parquet"]),
                         ("samples", ["r03", "T2_a.parquet"]), ("history", ["r04.parquet"])):
        with open(store.path(table, *parts), "wb") as f:
            f.write(b"garbage")
    for _ in range(2):  # cold and warm index
        s = Store(store.root, "s")
        seen = s.summary()
        for i in range(N_RUNS):
            rid = f"r{i:02d}"
            assert seen.run_row(rid) == s.run_row(rid)
            assert seen.eval_keys(rid) == s.eval_keys(rid)
            assert seen.history_readable(rid) == s.readable("history", f"{rid}.parquet")
        assert seen.run_row("r01") is None and seen.eval_keys("r02") == {"T2_a"}
        assert seen.eval_keys("r03") == {"T1_a"} and not seen.history_readable("r04")
        assert len(s.unreadable) == 4


# ---- a report over a big store: each figure drawn as few times as its files need, reads once ----------
def _draws(monkeypatch) -> list[int]:
    """Every Figure.draw from now on (real drawing, counted): the number of visible axes it drew."""
    from matplotlib.figure import Figure

    seen, draw = [], Figure.draw

    def counted(fig, renderer):
        seen.append(sum(a.get_visible() for a in fig.axes))
        return draw(fig, renderer)

    monkeypatch.setattr(Figure, "draw", counted)
    return seen


def _busy_figure():
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for i, ax in enumerate(axes):
        for k in range(12):
            ax.plot([1, 2, 4], [k, k + i, k * 2], marker="o", label=f"model {k} with a long label")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle("a figure with many lines")
    fig.tight_layout()
    return fig


def test_save_measures_the_figure_once_and_writes_the_same_png(tmp_path, monkeypatch):
    """bbox_inches="tight" per file drew every figure twice per file (a measuring draw, then the file);
    save draws twice in all (PNG, SVG: the crop box is measured without a draw), and the PNG is pixel
    for pixel what savefig(bbox_inches="tight") writes."""
    import matplotlib.image as mpimg

    from analysis.figures import PNG_DPI, save

    ref = _busy_figure()
    ref.savefig(tmp_path / "ref.png", dpi=PNG_DPI, bbox_inches="tight")
    fig = _busy_figure()
    seen = _draws(monkeypatch)
    paths = save(fig, str(tmp_path), "fig", "svg")
    assert len(seen) == 2, f"{len(seen)} draws for two files"
    assert [p.rsplit(".", 1)[1] for p in paths] == ["png", "svg"]
    got, want = mpimg.imread(paths[0]), mpimg.imread(tmp_path / "ref.png")
    assert got.shape == want.shape and (got == want).all()


def test_cross_depth_heatmaps_are_drawn_one_panel_at_a_time(tmp_path, monkeypatch):
    """sns.heatmap draws the whole figure to check its tick labels: with n panels that was n draws of
    up to n panels each (quadratic in models). Now only saving draws the figure: once per file."""
    from analysis.figures import FIGURES, Options
    from test_analysis_data import _write, eval_row, run_row

    root = str(tmp_path / "results")
    store = Store(root, "cd")
    widths = (16, 24, 32)  # three families of models: three heatmaps
    for d in widths:
        for L in (1, 3):
            run = run_row("cd", "sudoku", {"n": 4, "mask_rate": 0.3}, 1, L, d_model=d)
            _write(store, run, [eval_row(run, T, L_s, "vpr", 0.5) for T in (2, 4) for L_s in (1, 3)], history=False)
    from analysis.load import load_study

    data = load_study(root, "cd")
    seen = _draws(monkeypatch)
    paths = FIGURES["cross-depth"](data, str(tmp_path / "fig"), Options())
    assert sum(p.endswith(".csv") for p in paths) == len(widths)
    assert len(seen) == 2 and all(n == len(widths) for n in seen), f"figure draws: {seen}"  # PNG, SVG


def test_a_table_read_is_one_chunk_per_column(tmp_path):
    """Rows of thousands of files were handed to pandas as one Arrow chunk per file; every groupby and
    merge of the report then paid per chunk (aggregate: seconds at 1,000 runs). One chunk now."""
    store = build(tmp_path)
    for fresh in (store, Store(store.root, "s")):  # parsed, then from the index
        for table in ("runs", "evals", "history"):
            df = fresh.read(table)
            assert df["run_id"].array.__arrow_array__().num_chunks == 1
            same(df, reference(store, table))


def test_effective_params_reads_only_the_samples_of_points_it_uses(tmp_path, monkeypatch):
    """It read every samples file of a run (20 per run at 20 points) to use the few at L_s = L_t; now
    each file it uses once, nothing else, and the same numbers."""
    from analysis.effective import effective_params
    from analysis.load import load_study
    from test_effective_params import write_study

    root = str(tmp_path / "results")
    write_study(root, "eff")
    data = load_study(root, "eff")
    want = effective_params(data).table
    rid = next(r for r in data.runs["run_id"] if "1x2" in r and r.endswith("s0"))
    unused = Store(root, "eff")
    for T in (1, 2):  # samples of a point the analysis never uses (L_s = 1 != L_t = 2)
        unused.write_rows("samples", [full_row("samples", run_id=rid, eval_key=f"T{T}-Ls1-x", example=0, score=1.0)],
                          rid, f"T{T}-Ls1-x.parquet")
    data = load_study(root, "eff")
    reads = []
    original = Store.read_bytes
    monkeypatch.setattr(Store, "read_bytes", lambda self, path: reads.append(path) or original(self, path))
    got = effective_params(data).table
    pd.testing.assert_frame_equal(got, want)
    samples = [p for p in reads if "/samples/" in p]
    assert sorted(samples) == sorted({p for p in samples}), "a samples file read twice"
    assert not [p for p in samples if f"/{rid}/" in p and "-Ls1-" in p], samples  # never the unused points
    assert len([p for p in samples if unused.exists(p)]) == 2  # (1 x 2) seed 0 at T = 1 and 2


# ---- an index rewritten after new files: built from long slices of the old one, the same bytes --------
def _grow(store: Store) -> None:
    """After indexing: MIN_NEW+ new runs (every table), one file rewritten, one deleted, an evals file of no
    rows and a garbage one; every file then old enough to index but the newest run's."""
    for i in range(N_RUNS, N_RUNS + index.MIN_NEW + 2):
        write_run(store, f"r{i:02d}", i / 10, "42")
    store.write_rows("evals", [full_row("evals", run_id="r07", eval_key="T1_a", metric="vpr", value=0.99)],
                     "r07", "T1_a.parquet")
    store.write_rows("history", [full_row("history", run_id="r07", step=s, loss=2.0, L_t=1) for s in range(5)],
                     "r07.parquet")
    store.delete(store.path("evals", "r05", "T2_a.parquet"))
    store.write_rows("evals", [], "r08", "T9_a.parquet")
    with open(store.path("evals", f"r{N_RUNS + 3:02d}", "T2_a.parquet"), "wb") as f:
        f.write(b"garbage")
    age_all(store, OLD)


def test_an_index_rewritten_after_new_files_is_byte_for_byte_the_one_built_from_scratch(tmp_path):
    """read_table and scan rebuild the index from long slices of the old one plus the files parsed now: the
    file written is byte for byte what a read with no index at all writes; the rows and Store.summary's
    verdicts are the same both ways."""
    import shutil

    base = build(tmp_path / "base")
    for t in ("runs", "evals", "history"):
        base.read(t)
    base.summary()
    _grow(base)
    tables = ("runs", "evals", "history", "samples")
    for entry in ("read", "summary"):
        idx, reads, verdicts = {}, {}, {}
        for way in ("slices", "scratch"):
            root = tmp_path / f"{entry}-{way}"
            shutil.copytree(base.root, root, copy_function=shutil.copy2)  # mtimes kept: the same state
            store = Store(str(root), "s")
            before = {t: open(f"{store.dir}/_index/{t}.parquet", "rb").read() for t in tables}
            if way == "scratch":
                shutil.rmtree(f"{store.dir}/_index")
            if entry == "read":
                reads[way] = {t: store.read(t) for t in ("runs", "evals", "history")}
            else:
                s = store.summary()
                rids = [f"r{i:02d}" for i in range(N_RUNS + index.MIN_NEW + 2)]
                verdicts[way] = [(s.run_row(r), s.eval_keys(r), s.eval_keys(r, whole=True), s.half_keys(r),
                                  s.history_readable(r), s.has_history(r)) for r in rids]
            idx[way] = {t: open(f"{store.dir}/_index/{t}.parquet", "rb").read()
                        for t in (tables if entry == "summary" else tables[:3])}
            if way == "slices":
                for t, data in idx[way].items():
                    assert data != before[t], f"{t}: the index was not rewritten"
                    got = index.load_index(store, t, SCHEMAS[t])
                    names = set(got["_file"].to_pylist())
                    assert f"r{N_RUNS + 1:02d}" in " ".join(names)  # a new run's file indexed
                    assert not [n for n in names if n.startswith(f"r{N_RUNS - 1:02d}")]  # the racy newest: not
                    if t == "evals":  # no rows, unreadable, deleted: not indexed
                        assert "r08/T9_a.parquet" not in names and f"r{N_RUNS + 3:02d}/T2_a.parquet" not in names
                        assert "r05/T2_a.parquet" not in names
                    if t in index.ROWS_TABLES:
                        same(got.drop_columns([n for n, _ in index.META]).to_pandas(),
                             reference(store, t)[lambda df: ~df["run_id"].eq(f"r{N_RUNS - 1:02d}")])
        for t in idx["slices"]:
            assert idx["slices"][t] == idx["scratch"][t], f"{entry} {t}: slices and scratch indexes differ"
        if entry == "read":
            for t, df in reads["slices"].items():
                same(df, reference(Store(str(tmp_path / "read-slices"), "s"), t))
                same(df, reads["scratch"][t])
        else:
            assert verdicts["slices"] == verdicts["scratch"]
            assert verdicts["slices"][7][1] == {"T1_a", "T2_a"} and verdicts["slices"][5][1] == {"T1_a"}
