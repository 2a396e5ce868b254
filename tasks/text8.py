"""Text8: character-level language modelling on 27 symbols (a-z and space), scored by likelihood.

Data: the real text8 file from a path the user gives (100,000,000 characters, split 90M / 5M /
5M into train / valid / test, the standard split), or, when no path is given, a small
text8-style corpus made offline from the documentation text that every CPython ships
(`pydoc_data.topics`), normalized the way text8 was: lower case, digits spelled out, every
other character a space, runs of spaces collapsed. Any other corpus is split 90 / 5 / 5 %.
`download_text8` fetches the real file when the machine is online (never in tests).

Metrics (computed by `study.engine.evaluate` with `model.train.nll_bound`, since tasks never import the model):
the MDM's NLL bound per character in nats, bits per character and perplexity, estimated over a
fixed, seeded, stratified set of `n_t` noise levels t. Generated samples are kept for a look and
scored by `score`: the share of their words that occur in the training text.
"""
from __future__ import annotations

import functools
import hashlib
import io
import math
import os
import re
import zipfile
from typing import Literal

import numpy as np
from pydantic import Field

from atomicio import write_bytes
from tasks.base import DataBoundError, EvalSet, Metric, Task, TaskConfig, torch  # torch: imported on first use

ALPHABET = "abcdefghijklmnopqrstuvwxyz "
SPACE = 26
TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
TEXT8_ZIP_BYTES = 31_344_016  # size of text8.zip as published (also checked by TensorFlow's word2vec tutorial)
TEXT8_CHARS = 100_000_000
SPLITS = ("train", "valid", "test")
_DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_SPELLED = {ord("0") + i: f" {w} " for i, w in enumerate(_DIGIT_WORDS)}  # str.translate: digit -> " word "


class Text8Config(TaskConfig):
    name: Literal["text8"] = "text8"
    path: str | None = Field(None, description="a text8 file; none: the offline corpus from Python's own docs")
    seq_len: int = Field(256, ge=8, description="characters per sequence")
    n_test: int = Field(256, ge=1, description="evaluation sequences (consecutive chunks of the split)")
    n_val: int | None = Field(None, ge=1, description="validation sequences (chunks of the 'valid' slice); "
                                                      "default: n_test")
    n_t: int = Field(16, ge=1, description="noise levels t of the NLL estimate (fixed, seeded, stratified)")
    eval_split: Literal["valid", "test"] = Field(
        "test", description="the slice the reported evaluation reads; 'valid' is the validation slice (split 'val')")
    data_seed: int = 0

    # n_t shapes every likelihood estimate; eval_split decides which slice 'test' reads
    EVAL_FIELDS = {"test": ("n_test", "n_t", "eval_split"), "val": ("n_val", "n_test", "n_t")}

    def split_of(self, split: str) -> str:
        """'valid' is text8's name for the validation slice; with eval_split: valid, 'test' reads it too."""
        if split == "valid" or (split == "test" and self.eval_split == "valid"):
            return "val"
        return super().split_of(split)


# ---- text ------------------------------------------------------------------------------------
class Text8Error(ValueError):
    """A corpus file that is not text8-style, with its file and position in the message."""


_LUT = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(ALPHABET):
    _LUT[ord(_c)] = _i


def encode_text(data: bytes, where: str = "text") -> np.ndarray:
    """Bytes of a-z and space -> uint8 ids 0..26; any other byte fails naming its line and column."""
    ids = _LUT[np.frombuffer(data, dtype=np.uint8)]
    bad = np.flatnonzero(ids == 255)
    if bad.size:
        k = int(bad[0])
        line = data.count(b"\n", 0, k) + 1
        col = k - (data.rfind(b"\n", 0, k) + 1) + 1
        raise Text8Error(f"{where}:{line}:{col}: byte {data[k:k + 1]!r} is not a-z or space "
                         f"(text8 holds only these 27 symbols)")
    return ids


def decode_text(ids) -> str:
    return "".join(ALPHABET[i] if 0 <= i < 27 else "_" for i in (ids.tolist() if hasattr(ids, "tolist") else ids))


def normalize(text: str) -> str:
    """text8's normalization: lower case, digits spelled out, everything else a space, spaces collapsed."""
    return " ".join(re.sub("[^a-z0-9]", " ", text.lower()).translate(_SPELLED).split())


def offline_corpus() -> str:
    """A text8-style corpus (~0.35M characters) from the documentation CPython installs with itself."""
    from pydoc_data.topics import topics

    return normalize(" ".join(topics[k] for k in sorted(topics)))


def load_corpus(path: str | None) -> np.ndarray:
    """Token ids of the whole corpus: a text8 file (one line of a-z and space; a final newline is
    allowed), or the offline corpus when `path` is None."""
    if path is None:
        return encode_text(offline_corpus().encode(), "offline corpus")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise Text8Error(f"{path}: no such text8 file (download it with `study text8-download`)") from None
    if data.endswith(b"\n"):
        data = data[:-1]
    if not data:
        raise Text8Error(f"{path}: empty file")
    return encode_text(data, path)


def split_corpus(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The standard text8 split (first 90M / next 5M / last 5M characters); 90 / 5 / 5 % otherwise."""
    a, b = _split_points(len(ids))
    return {"train": ids[:a], "valid": ids[a:b], "test": ids[b:]}


def _split_points(n: int) -> tuple[int, int]:
    return (90_000_000, 95_000_000) if n == TEXT8_CHARS else (int(n * 0.9), int(n * 0.95))


def split_sizes(path: str | None) -> dict[str, int] | None:
    """Characters of each slice of the corpus, without reading a text8 file (its size is enough); None
    when the file is not on this machine (a cluster's nodes may hold it: checked where it is read)."""
    if path is None:
        n = len(_offline_ids())
    else:
        try:
            n = os.path.getsize(path)
            if n:
                with open(path, "rb") as f:
                    f.seek(n - 1)
                    n -= f.read(1) == b"\n"  # load_corpus drops one final newline
        except OSError:
            return None
    a, b = _split_points(n)
    return {"train": a, "valid": b - a, "test": n - b}


@functools.lru_cache(maxsize=1)
def _offline_ids() -> np.ndarray:
    return load_corpus(None)


def download_text8(dest_dir: str, sha256: str | None = None, url: str = TEXT8_URL) -> str:
    """Download text8.zip, check it, unpack `text8` into `dest_dir`; returns the file's path.

    Checks: the archive's published size, the member's CRC-32 (zipfile verifies it on read),
    exactly 100,000,000 characters of a-z and space, and, when given, the SHA-256 of the zip.
    """
    import urllib.request  # here: every `study` command imports the tasks, and downloading is rare

    with urllib.request.urlopen(url, timeout=60) as r:  # noqa: S310 (a fixed or user-given URL)
        blob = r.read()
    digest = hashlib.sha256(blob).hexdigest()
    if sha256 and digest != sha256.lower():
        raise Text8Error(f"{url}: SHA-256 {digest} does not match the expected {sha256}")
    if url == TEXT8_URL and len(blob) != TEXT8_ZIP_BYTES:
        raise Text8Error(f"{url}: {len(blob)} bytes, expected {TEXT8_ZIP_BYTES}")
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            if "text8" not in z.namelist():
                raise Text8Error(f"{url}: no member 'text8' in the archive (has {z.namelist()[:5]})")
            data = z.read("text8")  # raises BadZipFile on a CRC mismatch
    except zipfile.BadZipFile as e:
        raise Text8Error(f"{url}: corrupt archive ({e})") from None
    if len(data) != TEXT8_CHARS:
        raise Text8Error(f"{url}: text8 has {len(data)} characters, expected {TEXT8_CHARS}")
    encode_text(data, f"{url}!text8")
    path = os.path.join(dest_dir, "text8")
    write_bytes(path, data)
    return path


# ---- the task --------------------------------------------------------------------------------
class Text8(Task):
    name = "text8"
    # the evals rows written (study/engine/evaluate.py): each the mean of per-sequence scores; perplexity is exp(nll)
    metrics = (Metric("nll", "NLL bound (nats / char)", higher_is_better=False, likelihood=1.0),
               Metric("bpc", "bits per char", higher_is_better=False, likelihood=math.log(2)),
               Metric("ppl", "perplexity", higher_is_better=False, stored=False))
    primary_metric = "nll"
    eval_mode = "likelihood"  # study.engine.evaluate computes the NLL bound instead of sampling-and-scoring
    sample_score = "bpc"  # a samples row's `score`: bits per char (as stores have always held it)
    describe_fields = ("seq_len",)

    def __init__(self, cfg: Text8Config):
        super().__init__(cfg)
        self.cfg: Text8Config = cfg
        self.splits: dict[str, np.ndarray] | None = None
        self._words: set[str] | None = None

    @property
    def vocab_size(self) -> int:
        return 27

    def pos_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple((i,) for i in range(self.cfg.seq_len))

    def pos_sizes(self) -> tuple[int, ...]:
        return (self.cfg.seq_len,)

    def free_positions(self) -> tuple[int, int]:
        return self.cfg.seq_len, self.cfg.seq_len  # unconditional: every character

    def prepare(self, cache_dir: str | None) -> None:
        # the file itself is the cache: reading 100M characters into ids takes about a second
        if self.splits is not None:
            return
        self.splits = split_corpus(load_corpus(self.cfg.path))
        need = self.cfg.seq_len + 1
        for s in SPLITS:
            if len(self.splits[s]) < need:
                raise Text8Error(f"{self.cfg.path or 'offline corpus'}: split {s!r} has {len(self.splits[s])} "
                                 f"characters, fewer than seq_len={self.cfg.seq_len}")

    def check_data(self, splits: tuple[str, ...] = ("test",)) -> None:
        """The corpus is fixed: every slice must hold a sequence, and each evaluated split its n_test /
        n_val consecutive sequences (eval_set would otherwise evaluate fewer than asked)."""
        sizes = split_sizes(self.cfg.path)
        if sizes is None:
            return
        c, L = self.cfg, self.cfg.seq_len
        corpus = c.path or "the offline corpus (no task.path)"
        for s in SPLITS:
            if sizes[s] < L + 1:
                raise DataBoundError("task.seq_len", f"{L} does not fit the {s!r} slice of {corpus} "
                                                     f"({sizes[s]:,} characters)")
        for split in dict.fromkeys(splits):
            which = c.split_of(split)
            key, asked = ("task.n_test", c.n_test) if split == "test" else \
                ("task.n_val" if c.n_val is not None else "task.n_val (default: n_test)", c.val_size)
            s = "valid" if which == "val" else "test"
            if asked > sizes[s] // L:
                raise DataBoundError(key, f"{asked} sequences asked, but the {s!r} slice of {corpus} holds "
                                          f"{sizes[s] // L:,} sequences of seq_len {L} ({sizes[s]:,} characters)")

    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        data = self.splits["train"]
        L = self.cfg.seq_len
        starts = torch.randint(0, len(data) - L + 1, (batch_size,), generator=gen).numpy()
        x0 = torch.from_numpy(data[starts[:, None] + np.arange(L)].astype(np.int64))  # (B, L)
        return x0, torch.zeros_like(x0, dtype=torch.bool)  # unconditional: nothing given

    def eval_set(self, split: str = "test") -> EvalSet:
        """Consecutive, non-overlapping chunks of the test slice, or of the held-out 'valid' slice for
        'val' (also what 'test' reads under eval_split: valid)."""
        which = self.cfg.split_of(split)
        data = self.splits["valid" if which == "val" else "test"]
        L = self.cfg.seq_len
        n = min(self.cfg.n_test if split == "test" else self.cfg.val_size, len(data) // L)
        x0 = torch.from_numpy(data[: n * L].astype(np.int64)).view(n, L)
        return EvalSet(x0, torch.zeros_like(x0, dtype=torch.bool))

    def t_values(self) -> torch.Tensor:
        """The fixed, seeded, stratified noise levels of the NLL estimate: t_i in ((i + u_i) / n_t)."""
        g = torch.Generator().manual_seed(self.cfg.data_seed + 0x7E78)
        n = self.cfg.n_t
        t = (torch.arange(n, dtype=torch.float64) + torch.rand(n, generator=g, dtype=torch.float64)) / n
        return t.clamp(min=1e-3)

    # ---- scoring ---------------------------------------------------------------------------
    def train_words(self) -> set[str]:
        if self._words is None:
            self._words = set(decode_text(self.splits["train"][:5_000_000]).split())
        return self._words

    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        """Per generated sample: the share of its whole words (not cut by the ends) seen in training."""
        words = self.train_words()
        rows = []
        for o in output.cpu():
            ws = decode_text(o).split(" ")[1:-1]  # the first and last may be cut mid-word
            ws = [w for w in ws if w]
            rows.append({"known_words": sum(w in words for w in ws) / len(ws) if ws else 0.0})
        return rows

    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        t = tokens.tolist()
        keep = cond.tolist() if cond is not None else [True] * len(t)
        return "".join(ALPHABET[v] if k and 0 <= v < 27 else "_" for v, k in zip(t, keep))
