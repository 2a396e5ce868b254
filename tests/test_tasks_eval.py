"""`study eval RUN_ID --puzzles FILE`: a real tiny 4x4 Sudoku run trained through
`study.engine.trial.execute` (real Parquet), then external puzzle files solved from its stored
weights; and the compute every evals row records (forward_passes, eval_flops), counted with a
hook on the block. Run: pytest tests/test_tasks_eval.py"""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from study.cli import app
from study.spec.grid import expand
from store import Store
import study.commands.puzzles as puzzles
from study.commands.puzzles import load_run_model
from study.engine.trial import evaluate_point
from study.engine.trial import execute
from study.engine.options import TrialOptions
from tasks import make_task
from tasks.sudoku import DIGITS, generate_solutions

GRID = {
    "study": "ev4",
    "task": {"name": "sudoku", "n": 4, "mask_rate": 0.4, "n_train": 120, "n_test": 40, "data_seed": 3},
    "model": {"d_model": 32, "n_heads": 4},
    "train": {"steps": 200, "batch_size": 32, "lr": 3e-3, "warmup": 20, "checkpoint_every": 1000},
    "eval": {"T": [1, 4], "n_examples": 40},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    run = expand(GRID, "ev4.yaml").runs[0]
    store = Store(str(root), "ev4")
    execute(run, store, TrialOptions("test"))
    return str(root), run.run_id, store


def _puzzles(seed: int, n_puz: int, blank: str) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    sols = generate_solutions(4, n_puz, seed=seed + 100)
    quiz, full = [], []
    for g in sols:
        s = "".join(DIGITS[v] for v in g)
        holes = rng.choice(16, 6, replace=False)
        quiz.append("".join(blank if i in holes else ch for i, ch in enumerate(s)))
        full.append(s)
    return quiz, full


def _vpr(line: str, quiz: str) -> bool:
    g = np.array([DIGITS.index(c) for c in line]).reshape(4, 4)
    keeps = all(q in ".0" or q == c for q, c in zip(quiz, line))
    boxes = g.reshape(2, 2, 2, 2).transpose(0, 2, 1, 3).reshape(4, 4)
    return keeps and all(sorted(r) == [0, 1, 2, 3] for m in (g, g.T, boxes) for r in m)


def test_eval_lines_file_writes_rows_and_completed_grids(trained, tmp_path):
    root, run_id, store = trained
    quiz, _ = _puzzles(0, 30, ".")
    src = tmp_path / "ext.txt"
    src.write_text("# external puzzles\n" + "\n".join(f"{q}  #{i}" for i, q in enumerate(quiz)) + "\n")
    out = tmp_path / "solved.txt"
    r = CliRunner().invoke(app, ["eval", run_id, "--puzzles", str(src), "--T", "4", "--out", str(out),
                                 "--results", root])
    assert r.exit_code == 0, r.output
    lines = out.read_text().splitlines()
    assert len(lines) == 30 and all(ln.endswith(f"  #{i}") for i, ln in enumerate(lines))
    solved = [ln.split()[0] for ln in lines]
    vpr = np.mean([_vpr(s, q) for s, q in zip(solved, quiz)])
    evals = store.read("evals", run_id)
    ext = evals[evals["split"] == "external:ext.txt"]
    assert list(ext.metric) == ["vpr"] and ext.value.iloc[0] == pytest.approx(vpr)  # the file agrees with the row
    assert ext["T"].iloc[0] == 4 and ext.L_s.iloc[0] == 1 and ext.n_examples.iloc[0] == 30
    assert vpr >= 0.1, vpr  # chance: a random fill of 6 blanks is valid with probability ~ 1/4^6
    assert "vpr" in r.output
    samples = store.read("samples", run_id)
    s = samples[samples.eval_key == ext.eval_key.iloc[0]].sort_values("example")
    assert list(s.input) == quiz and list(s.output) == solved and s.reference.isna().all()
    # evaluating the run's own test split earlier did not count these rows, nor do they replace them
    sampled = evals[evals.sampler != "likelihood"]  # the continuous quantities' point (nll-test) apart
    assert set(sampled[sampled["split"] == "test"].metric) == {"vpr", "cell_acc", "exact"}


def test_eval_csv_reports_cell_accuracy_and_keeps_format(trained, tmp_path):
    root, run_id, store = trained
    quiz, full = _puzzles(1, 12, "0")
    src = tmp_path / "ext.csv"
    src.write_text("quizzes,solutions\n" + "".join(f"{q},{f}\n" for q, f in zip(quiz, full)))
    out = tmp_path / "solved.csv"
    r = CliRunner().invoke(app, ["eval", run_id, "--puzzles", str(src), "--out", str(out), "--results", root,
                                 "--study", "ev4"])
    assert r.exit_code == 0, r.output
    rows = out.read_text().splitlines()
    assert rows[0] == "quizzes,solutions" and [x.split(",")[0] for x in rows[1:]] == quiz
    ext = store.read("evals", run_id)
    ext = ext[ext["split"] == "external:ext.csv"]
    assert set(ext.metric) == {"vpr", "cell_acc", "exact"} and (ext["T"] == 4).all()  # T: the run's largest


def test_eval_errors(trained, tmp_path):
    root, run_id, _ = trained
    bad = tmp_path / "bad.txt"
    bad.write_text("1234341221434321\n12343412214343\n")
    r = CliRunner().invoke(app, ["eval", run_id, "--puzzles", str(bad), "--results", root])
    assert r.exit_code == 2 and f"{bad}:2: expected 16 cells" in r.output
    r = CliRunner().invoke(app, ["eval", "feedbeef0000", "--puzzles", str(bad), "--results", root])
    assert r.exit_code == 2 and "no final weights of run 'feedbeef0000'" in r.output


def test_stored_compute_is_the_block_calls_that_ran(trained, tmp_path, monkeypatch):
    """forward_passes / eval_flops in the store count what the sampler ran, checked with a hook on
    the block: at T = 20 a 4x4 grid has at most 15 blanks, so fewer than T steps run (the old
    rows said T * L_s = 20). The puzzle-file command stores the same accounting."""
    root, run_id, store = trained
    run = expand({**GRID, "eval": {**GRID["eval"], "T": [20]}}, "ev4.yaml").runs[0]
    _, _, model = load_run_model(store, run_id)
    task = make_task(run.task)
    rows = []  # examples through the block, one entry per loop of a model call
    hook = model.block[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
    (pt,) = run.eval_points()
    with store.task_data() as data_dir:
        task.prepare(data_dir)
    ev = task.eval_set(pt.split)
    evaluate_point(run, pt, model, task, ev, store)
    got = store.read("evals", run_id)
    got = got[got.eval_key == pt.key].iloc[0]
    n = int(got.n_examples)
    assert n == 40 and set(rows) == {n}  # one batch: every call carries all 40 puzzles
    assert got.forward_passes == len(rows) < 20  # block passes per example, at L_s = 1
    assert got.eval_flops == sum(rows) * model.flops_per_forward(pt.L_s)

    rows.clear()
    quiz, _ = _puzzles(2, 10, ".")  # 6 blanks each
    src = tmp_path / "six.txt"
    src.write_text("\n".join(quiz) + "\n")
    hook.remove()
    orig = puzzles.load_run_model

    def hooked(*a, **k):  # the real loader; the hook only counts
        cfg, task, m = orig(*a, **k)
        m.block[0].register_forward_hook(lambda mod, inp, out: rows.append(inp[0].shape[0]))
        return cfg, task, m

    monkeypatch.setattr(puzzles, "load_run_model", hooked)
    s = puzzles.evaluate_puzzles(run_id, str(src), results=root, T=20, L_s=2, device="cpu")
    ext = store.read("evals", run_id)
    ext = ext[ext.eval_key == s["eval_key"]].iloc[0]
    assert len(rows) == 6 * 2 and ext.forward_passes == 12 and ext["T"] == 20
    assert ext.eval_flops == 6 * 10 * model.flops_per_forward(2)


def test_likelihood_rows_count_block_passes_per_example(tmp_path):
    """Text8: forward_passes means block passes per example in every row. The NLL bound calls
    the model once per noise level (n_t = 8) at L_s = 2 loops; the generated samples at T = 60
    on 48 free characters stop after 48 steps. Checked with a hook on the block."""
    from model import RecursiveDenoiser, SeqSpec

    raw = {"study": "t8", "task": {"name": "text8", "seq_len": 48, "n_test": 24, "n_t": 8},
           "model": {"d_model": 16, "n_heads": 2, "L": 2},
           "eval": {"T": [60], "n_examples": 24, "n_samples_kept": 4}}
    run = expand(raw, "t8.yaml").runs[0]
    store = Store(str(tmp_path), "t8")
    task = make_task(run.task)
    with store.task_data() as data_dir:
        task.prepare(data_dir)
    model = RecursiveDenoiser(run.model, SeqSpec(task.vocab_size, task.pos_ids(), task.pos_sizes()))
    batches = []  # examples through the block, one entry per loop of a model call
    model.block[0].register_forward_hook(lambda mod, inp, out: batches.append(inp[0].shape[0]))
    (pt,) = run.eval_points()
    evaluate_point(run, pt, model, task, task.eval_set(pt.split), store)
    ev = store.read("evals").set_index("metric")
    nll_calls = [b for b in batches if b == 24]  # the bound: all 24 sequences at once
    gen_calls = [b for b in batches if b == 4]  # the 4 generated samples
    assert len(nll_calls) + len(gen_calls) == len(batches)
    for m in ("nll", "bpc"):
        assert ev.loc[m, "forward_passes"] == len(nll_calls) == 8 * 2
        assert ev.loc[m, "eval_flops"] == sum(nll_calls) * model.flops_per_forward(2) // 2
    assert ev.loc["known_words", "forward_passes"] == len(gen_calls) == 48 * 2
    assert ev.loc["known_words", "eval_flops"] == sum(gen_calls) * model.flops_per_forward(2) // 2
