"""Text8: loader and its errors, the offline corpus, the NLL bound, a tiny real training through
`study.engine.trial.execute` (real Parquet). Never touches the network. Run: pytest tests/test_tasks_text8.py"""
from __future__ import annotations

import io
import json
import math
import zipfile

import numpy as np
import pytest
import torch

from model import ModelConfig, RecursiveDenoiser, SeqSpec
from model.train import nll_bound
from study.spec.grid import expand
from store import Store
from study.engine.trial import execute
from study.engine.options import TrialOptions
from tasks import make_task
from tasks.text8 import (TEXT8_CHARS, Text8, Text8Config, Text8Error, decode_text, download_text8, load_corpus, normalize, offline_corpus, split_corpus)


def test_normalize_is_text8_style():
    assert normalize("Hello, World! 42 times\n\tover") == "hello world four two times over"
    assert normalize("état café") == "tat caf"  # non a-z letters become spaces, as in text8


def test_offline_corpus_is_27_symbols_and_split_90_5_5():
    text = offline_corpus()
    assert len(text) > 200_000 and set(text) <= set("abcdefghijklmnopqrstuvwxyz ") and "  " not in text
    ids = load_corpus(None)
    assert decode_text(ids[:200]) == text[:200]
    s = split_corpus(ids)
    assert [len(s[k]) for k in ("train", "valid", "test")] == [int(len(ids) * 0.9),
                                                               int(len(ids) * 0.95) - int(len(ids) * 0.9),
                                                               len(ids) - int(len(ids) * 0.95)]
    assert (np.concatenate([s["train"], s["valid"], s["test"]]) == ids).all()


def test_real_text8_uses_the_standard_split():
    ids = np.empty(TEXT8_CHARS, dtype=np.uint8)
    s = split_corpus(ids)
    assert (len(s["train"]), len(s["valid"]), len(s["test"])) == (90_000_000, 5_000_000, 5_000_000)


def test_loader_errors_name_the_file_and_position(tmp_path):
    p = tmp_path / "t8"
    p.write_bytes(b"anarchism originated as a Term of abuse")
    with pytest.raises(Text8Error, match=r"t8:1:27: byte b'T' is not a-z or space"):
        load_corpus(str(p))
    p.write_bytes(b"anarchism\noriginated")  # text8 is one line: an inner newline is an error too
    with pytest.raises(Text8Error, match=r"t8:1:10: byte b'\\n'"):
        load_corpus(str(p))
    with pytest.raises(Text8Error, match="no such text8 file"):
        load_corpus(str(tmp_path / "missing"))
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(Text8Error, match="empty"):
        load_corpus(str(tmp_path / "empty"))
    ok = tmp_path / "ok"
    ok.write_bytes(b"anarchism originated as a term of abuse\n")  # one final newline is allowed
    assert decode_text(load_corpus(str(ok))) == "anarchism originated as a term of abuse"
    task = Text8(Text8Config(path=str(ok), seq_len=16))
    with pytest.raises(Text8Error, match="fewer than seq_len=16"):
        task.prepare(None)


def test_download_checks_the_archive(tmp_path):
    """file:// URLs only: the checks are real, the network is never used."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("text8", "just a few words")
    good_zip = tmp_path / "small.zip"
    good_zip.write_bytes(buf.getvalue())
    with pytest.raises(Text8Error, match="expected 100000000"):
        download_text8(str(tmp_path / "out"), url=good_zip.as_uri())
    with pytest.raises(Text8Error, match="SHA-256"):
        download_text8(str(tmp_path / "out"), sha256="0" * 64, url=good_zip.as_uri())
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip at all")
    with pytest.raises(Text8Error, match="corrupt archive"):
        download_text8(str(tmp_path / "out"), url=bad.as_uri())


def test_batches_and_eval_chunks():
    task = make_task(Text8Config(seq_len=32, n_test=10))
    task.prepare(None)
    x0, cond = task.train_batch(4, torch.Generator().manual_seed(0))
    assert x0.shape == (4, 32) and not cond.any() and int(x0.max()) <= 26
    ev = task.eval_set()
    assert ev.x0.shape == (10, 32) and (ev.x0.reshape(-1).numpy() == task.splits["test"][:320]).all()
    t = task.t_values()
    assert len(t) == 16 and torch.equal(t, task.t_values()) and (t > 0).all() and (t <= 1).all()
    assert ((t * 16).floor() == torch.arange(16)).all()  # stratified: one t per sixteenth


def test_nll_bound_of_a_uniform_model_is_exact_by_hand():
    """With zero output weights every masked token costs log 27: the bound is mean_t(#masked_t / t) * log 27."""
    spec = SeqSpec(27, tuple((i,) for i in range(20)), (20,))
    model = RecursiveDenoiser(ModelConfig(K=1, L=1, d_model=16, n_heads=2), spec)
    torch.nn.init.zeros_(model.head.weight)
    torch.nn.init.zeros_(model.head.bias)
    x0 = torch.randint(0, 27, (3, 20), generator=torch.Generator().manual_seed(1))
    cond = torch.zeros_like(x0, dtype=torch.bool)
    cond[:, :5] = True
    t = torch.tensor([0.1, 0.5, 0.9])
    got = nll_bound(model, x0, cond, t, seed=7)
    gen = torch.Generator().manual_seed(7)
    want = torch.zeros(3, dtype=torch.float64)
    for tv in t.tolist():
        masked = (torch.rand(3, 20, generator=gen) < tv) & ~cond
        want += masked.sum(1).double() / tv * math.log(27)
    assert torch.allclose(got, want / 3, rtol=1e-5)


GRID = {
    "study": "t8",
    "task": {"name": "text8", "seq_len": 48, "n_test": 24, "n_t": 8},
    "model": {"d_model": 32, "n_heads": 4},
    "train": {"steps": 150, "batch_size": 32, "lr": 3e-3, "warmup": 20, "checkpoint_every": 1000},
    "eval": {"T": [8], "n_examples": 24, "n_samples_kept": 4},
}


def test_tiny_training_beats_chance_and_writes_likelihood_rows(tmp_path):
    """150 steps of a (1 x 1) d=32 model on the offline corpus: bits per char well below the
    uniform log2(27) = 4.75 (measured first on the untrained model), rows in real Parquet."""
    run = expand(GRID, "t8.yaml").runs[0]
    store = Store(str(tmp_path), "t8")
    execute(run, store, TrialOptions("test"))
    ev = store.read("evals")
    m = dict(zip(ev.metric, ev.value))
    # perplexity is exp(nll), derived by the analysis: every stored value is a mean of per-example scores
    assert set(m) == {"nll", "bpc", "known_words"}
    assert m["bpc"] == pytest.approx(m["nll"] / math.log(2))
    assert m["bpc"] < 4.3, m
    row = ev[ev.metric == "nll"].iloc[0]
    assert row.ci_low < row.value < row.ci_high and row.n_examples == 24 and row.forward_passes == 8
    samples = store.read("samples")
    gen = samples[samples.eval_key.str.endswith("-gen")]  # the unconditional generations: their own key
    assert len(gen) == 4 and gen.output.str.len().eq(48).all()
    assert set("".join(gen.output)) <= set("abcdefghijklmnopqrstuvwxyz ")
    per_seq = samples[~samples.eval_key.str.endswith("-gen")].sort_values("example")  # a row per sequence
    assert list(per_seq.example) == list(range(24)) and per_seq.reference.notna().sum() == 4
    assert m["nll"] == pytest.approx(np.mean([json.loads(x)["nll"] for x in per_seq.scores]))

    untrained = RecursiveDenoiser(run.model, SeqSpec(27, tuple((i,) for i in range(48)), (48,)))
    task = make_task(run.task)
    task.prepare(None)
    e = task.eval_set()
    chance = float((nll_bound(untrained, e.x0, e.cond, task.t_values()) / 48).mean()) / math.log(2)
    assert chance > 4.6 and m["bpc"] < chance - 0.4, (chance, m["bpc"])


def test_val_split_is_the_held_out_valid_slice():
    task = make_task(Text8Config(seq_len=32, n_test=10, n_val=6))
    task.prepare(None)
    test, val = task.eval_set("test"), task.eval_set("val")
    assert (test.x0.reshape(-1).numpy() == task.splits["test"][:320]).all()  # unchanged
    assert val.x0.shape == (6, 32) and (val.x0.reshape(-1).numpy() == task.splits["valid"][:192]).all()
    n_train, n_valid = len(task.splits["train"]), len(task.splits["valid"])
    whole = np.concatenate([task.splits[s] for s in ("train", "valid", "test")])
    # three consecutive, non-overlapping slices of the corpus: val is held out from train and test
    assert (whole[n_train:n_train + n_valid] == task.splits["valid"]).all()
    assert task.cfg.split_of("test") == "test" and task.cfg.split_of("valid") == "val"
    # eval_split: valid makes the reported evaluation read the validation slice, and says so
    v = make_task(Text8Config(seq_len=32, n_test=10, eval_split="valid"))
    assert v.cfg.split_of("test") == "val"


def test_verify_agrees_with_a_likelihood_store(tmp_path):
    """The samples rows' `score` is the metric the task declares (Text8.sample_score: bpc), and verify checks
    it against that one (it compared it with nll, and named every sequence of every text8 store a problem)."""
    from study.commands.verify import verify_study

    grid = {**GRID, "task": {**GRID["task"], "n_test": 8, "n_t": 4}, "train": {**GRID["train"], "steps": 5},
            "eval": {"T": [4], "n_examples": 8, "n_samples_kept": 2}}
    store = Store(str(tmp_path), "t8")
    execute(expand(grid, "t8.yaml").runs[0], store, TrialOptions("test"))
    v = verify_study(store)
    assert v.problems == [] and v.counts["metrics_recomputed"] == 3, v.problems[:3]
    samples = store.read("samples")
    per_seq = samples[~samples.eval_key.str.endswith("-gen")]
    assert [json.loads(s)["bpc"] for s in per_seq.scores] == per_seq.score.tolist()
