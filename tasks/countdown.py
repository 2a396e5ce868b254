"""Countdown with k operands: reach a target with + - * / on the operands, each used at most once.

Public format (diffusion-vs-autoregression work): input `15,44,79,50` (the operands, then the
target), output `44-15=29,79-29=50`. Arithmetic is on non-negative integers, division exact.

Token encoding for the diffusion model, fixed width: every number is a field of W positions
(W = digits of `max_value`), right-aligned, left-padded with the pad token. The sequence is the
input (k operand fields, then the target field; these are the conditioning positions) followed
by k-1 equation slots `A op B = C` of 3W + 2 positions each; unused trailing slots are all pad.
Decoding is strict: a field must read pad* digit+ without a leading zero, an operator slot an
operator, '=' its place; anything else renders as raw characters that the parser rejects.

Reaches Target Rate (RTR) parses the public text under a strict grammar (never Python eval):
every equation is true integer arithmetic (exact division, no division by zero, no negatives),
each of its operands is an input number or an earlier result not used before (a multiset:
each use consumes one copy), and the last result equals the target.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import random
import re
from collections import Counter
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from tasks.base import DataBound, EvalSet, Metric, Task, TaskConfig, cached_npz, torch, val_path  # torch: on first use

OPS = "+-*/"
EQ, PAD = 14, 15  # token ids: 0-9 digits, 10-13 OPS, 14 '=', 15 pad
CHARS = "0123456789" + OPS + "=_"  # how each token renders raw ('_' = pad)
MAX_DIGITS = 15  # longer numbers fail the parse ("huge numbers")
NUM = rf"(0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})"
EQUATION = re.compile(rf"{NUM}([-+*/]){NUM}={NUM}")


class CountdownConfig(TaskConfig):
    name: Literal["countdown"] = "countdown"
    n_operands: int = Field(4, description="operands per instance: 3, 4 or 5 in the paper")
    operand_min: int = Field(1, ge=0)
    operand_max: int = Field(99, ge=1, description="smaller ranges make easier, CPU-scale instances")
    target_min: int = Field(1, ge=0)
    target_max: int = Field(100, ge=0)
    max_value: int = Field(9999, ge=1, description="largest intermediate result; sets the field width")
    ops: str = Field("+-*/", description="allowed operators, a subset of '+-*/'")
    n_train: int = Field(50_000, ge=1)
    n_test: int = Field(500, ge=1, description="test instances, disjoint from training (operand multiset + target)")
    n_val: int | None = Field(None, ge=1, description="validation instances, disjoint from train and test like "
                                                      "the test split; default: n_test")
    data_seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> "CountdownConfig":
        if not 2 <= self.n_operands <= 6:
            raise ValueError(f"n_operands must be between 2 and 6 (got {self.n_operands})")
        if not self.ops or any(c not in OPS for c in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must be distinct characters of '+-*/' (got {self.ops!r})")
        if self.operand_min > self.operand_max:
            raise ValueError(f"operand_min ({self.operand_min}) > operand_max ({self.operand_max})")
        if self.target_min > self.target_max:
            raise ValueError(f"target_min ({self.target_min}) > target_max ({self.target_max})")
        if max(self.operand_max, self.target_max) > self.max_value:
            raise ValueError(f"max_value ({self.max_value}) must be >= operand_max and target_max")
        return self

    @property
    def width(self) -> int:
        return len(str(self.max_value))

    # val follows test in the same stream of distinct instances: it depends on n_test too
    EVAL_FIELDS = {"test": ("n_test",), "val": ("n_test", "n_val")}


# ---- instances ---------------------------------------------------------------------------
def apply_op(a: int, op: str, b: int) -> int | None:
    """a op b on non-negative integers; None when not allowed (negative, inexact or by zero)."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    if op == "/":
        return a // b if b != 0 and a % b == 0 else None
    raise ValueError(f"unknown operator {op!r}")


def random_instance(cfg: CountdownConfig, rng: random.Random, max_tries: int = 10_000
                    ) -> tuple[list[int], int, list[tuple[int, str, int, int]]]:
    """(operands, target, steps): combine random pairs with random allowed ops until one number is
    left; accept when it is a target in range. Steps are (a, op, b, c), larger operand first;
    results are >= 1 and <= max_value (references never make 0, the scorer does accept it)."""
    k = cfg.n_operands
    for _ in range(max_tries):
        operands = [rng.randint(cfg.operand_min, cfg.operand_max) for _ in range(k)]
        pool, steps = list(operands), []
        while len(pool) > 1:
            i, j = rng.sample(range(len(pool)), 2)
            a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
            choices = []
            for op in cfg.ops:
                c = apply_op(a, op, b)
                if c is not None and 1 <= c <= cfg.max_value:
                    choices.append((op, c))
            if not choices:
                break
            op, c = rng.choice(choices)
            steps.append((a, op, b, c))
            pool = [x for t, x in enumerate(pool) if t not in (i, j)] + [c]
        if len(pool) == 1 and len(steps) == k - 1 and cfg.target_min <= pool[0] <= cfg.target_max:
            return operands, pool[0], steps
    raise ValueError(f"no reachable target in [{cfg.target_min}, {cfg.target_max}] after {max_tries} tries: "
                     f"widen the target range or the operand range")


def instance_key(operands: list[int], target: int) -> tuple:
    return (tuple(sorted(operands)), target)


EXACT_COUNT_MAX_MULTISETS = 1500  # above this, `count_instances` gives an upper bound (exact costs seconds)


def count_instances(cfg: CountdownConfig) -> tuple[int, bool]:
    """(distinct (operand multiset, target) keys `random_instance` can make, exact?). Exact when the
    operand range holds at most EXACT_COUNT_MAX_MULTISETS multisets (every combination order and
    operator is followed, under the generator's rules: results in 1..max_value, larger operand
    first); otherwise the upper bound multisets x targets."""
    return _count_instances(cfg.model_dump_json(exclude={"n_train", "n_test", "n_val", "data_seed"}))


@functools.lru_cache(maxsize=64)
def _count_instances(cfg_json: str) -> tuple[int, bool]:
    cfg = CountdownConfig.model_validate_json(cfg_json)
    k, values = cfg.n_operands, range(cfg.operand_min, cfg.operand_max + 1)
    multisets = math.comb(len(values) + k - 1, k)
    if multisets > EXACT_COUNT_MAX_MULTISETS:
        return multisets * (cfg.target_max - cfg.target_min + 1), False

    @functools.lru_cache(maxsize=None)
    def reach(pool: tuple[int, ...]) -> frozenset[int]:  # final values of every way to combine a sorted pool
        if len(pool) == 1:
            return frozenset(pool)
        out: set[int] = set()
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                if j > i + 1 and pool[j] == pool[j - 1]:
                    continue  # the same pair of values as (i, j - 1)
                rest = pool[:i] + pool[i + 1:j] + pool[j + 1:]
                for op in cfg.ops:
                    c = apply_op(pool[j], op, pool[i])
                    if c is not None and 1 <= c <= cfg.max_value:
                        out |= reach(tuple(sorted((*rest, c))))
        return frozenset(out)

    return sum(sum(cfg.target_min <= t <= cfg.target_max for t in reach(m))
               for m in itertools.combinations_with_replacement(values, k)), True


def generate_split(cfg: CountdownConfig, val: bool = False) -> dict[str, np.ndarray]:
    """Train and test instances (and with `val`, validation ones), disjoint by (operand multiset,
    target); deterministic from the seed. One stream of distinct instances: the first n_train are
    train, the next n_test test, the next n_val val, so train and test never depend on val.

    Returns operands (M, k), targets (M,), steps (M, k-1, 4) with op as its index in OPS, for
    each split (`train_*`, `test_*`, `val_*`)."""
    rng = random.Random(f"countdown-{cfg.data_seed}-{cfg.n_operands}")
    seen: set[tuple] = set()
    rows: list[tuple] = []
    want = cfg.n_train + cfg.n_test + (cfg.val_size if val else 0)
    misses = 0
    while len(rows) < want:
        ops, tgt, steps = random_instance(cfg, rng)
        key = instance_key(ops, tgt)
        if key in seen:
            misses += 1
            if misses > 20 * want + 10_000:
                raise ValueError(f"only {len(rows)} distinct instances found, {want} asked: the operand/target "
                                 f"ranges are too small for n_train + n_test{' + n_val' if val else ''}")
            continue
        seen.add(key)
        rows.append((ops, tgt, steps))
    out = {}
    a, b = cfg.n_train, cfg.n_train + cfg.n_test
    parts = [("train", rows[:a]), ("test", rows[a:b])] + ([("val", rows[b:])] if val else [])
    for split, part in parts:
        out[f"{split}_operands"] = np.array([r[0] for r in part], dtype=np.int64)
        out[f"{split}_targets"] = np.array([r[1] for r in part], dtype=np.int64)
        out[f"{split}_steps"] = np.array([[(a, OPS.index(o), b, c) for a, o, b, c in r[2]] for r in part],
                                         dtype=np.int64).reshape(len(part), cfg.n_operands - 1, 4)
    return out


def format_input(operands: list[int], target: int) -> str:
    return ",".join(str(x) for x in [*operands, target])


# ---- strict scoring ----------------------------------------------------------------------
def parse_input(text: str) -> tuple[list[int], int]:
    parts = text.split(",")
    if len(parts) < 2 or not all(re.fullmatch(NUM, p) for p in parts):
        raise ValueError(f"bad countdown input {text!r}: expected comma-separated integers, operands then target")
    nums = [int(p) for p in parts]
    return nums[:-1], nums[-1]


def check_solution(operands: list[int], target: int, text: str) -> tuple[bool, str]:
    """(reaches target?, reason). Strict: no whitespace, no trailing junk, no eval."""
    if not text:
        return False, "empty output"
    pool = Counter(operands)
    last = None
    for n_eq, eq in enumerate(text.split(","), 1):
        m = EQUATION.fullmatch(eq)
        if m is None:
            return False, f"equation {n_eq} {eq[:40]!r} does not parse as A op B = C"
        a, op, b, c = int(m[1]), m[2], int(m[3]), int(m[4])
        if op == "/" and b == 0:
            return False, f"equation {n_eq}: division by zero"
        if apply_op(a, op, b) != c:
            return False, f"equation {n_eq}: {a}{op}{b} is not {c}"
        for x in (a, b):
            if pool[x] <= 0:
                return False, f"equation {n_eq}: {x} is not an input number or an unused earlier result"
            pool[x] -= 1
        pool[c] += 1
        last = c
    if last != target:
        return False, f"last result {last} is not the target {target}"
    return True, "ok"


def well_formed(text: str) -> bool:
    """Every equation parses (arithmetic and operands unchecked)."""
    return bool(text) and all(EQUATION.fullmatch(eq) for eq in text.split(","))


def last_result(text: str) -> int | None:
    """C of the last equation when the output is well formed (a diagnostic: RTR also needs the rest)."""
    return int(EQUATION.fullmatch(text.split(",")[-1])[4]) if well_formed(text) else None


# ---- the task ----------------------------------------------------------------------------
class Countdown(Task):
    name = "countdown"
    metrics = (Metric("rtr", "reaches-target rate (RTR)", "rate", unit=True, threshold=0.70),
               Metric("well_formed", "well-formed rate", "rate", unit=True),
               Metric("ends_on_target", "ends-on-target rate", "rate", unit=True),
               Metric("exact", "exact match rate", "rate", unit=True, needs_reference=True))
    primary_metric = "rtr"
    describe_fields = ("n_operands", "max_value")

    def __init__(self, cfg: CountdownConfig):
        super().__init__(cfg)
        self.cfg: CountdownConfig = cfg
        self.k, self.W = cfg.n_operands, cfg.width
        self.n_in = (self.k + 1) * self.W
        self.slot = 3 * self.W + 2
        self.train_x0: torch.Tensor | None = None
        self.test: EvalSet | None = None
        self._data_path: str | None = None

    # ---- declarations ----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(CHARS)

    @property
    def seq_len(self) -> int:
        return self.n_in + (self.k - 1) * self.slot

    def pos_ids(self) -> tuple[tuple[int, ...], ...]:
        return tuple((i,) for i in range(self.seq_len))

    def pos_sizes(self) -> tuple[int, ...]:
        return (self.seq_len,)

    def free_positions(self) -> tuple[int, int]:
        n = self.seq_len - self.n_in  # everything after the operands and target
        return n, n

    @classmethod
    def variant_name(cls, params: dict) -> str:
        ops = params.get("n_operands") or params.get("operands") or params.get("n")
        return f"countdown-{ops}" if ops else "countdown"

    def cond_mask(self) -> torch.Tensor:
        """(N,) bool: the input part (operands and target) is given."""
        m = torch.zeros(self.seq_len, dtype=torch.bool)
        m[: self.n_in] = True
        return m

    # ---- encoding --------------------------------------------------------------------------
    def _field(self, x: int) -> list[int]:
        s = str(int(x))
        if len(s) > self.W or x < 0:
            raise ValueError(f"{x} does not fit a {self.W}-digit field")
        return [PAD] * (self.W - len(s)) + [int(ch) for ch in s]

    def encode(self, operands, target, steps=()) -> list[int]:
        """Token ids of one instance; `steps` (a, op, b, c), op as a character or an index in OPS."""
        toks = [t for x in [*operands, target] for t in self._field(x)]
        for a, o, b, c in steps:
            op = OPS.index(o) if isinstance(o, str) else int(o)
            toks += self._field(a) + [10 + op] + self._field(b) + [EQ] + self._field(c)
        toks += [PAD] * (self.seq_len - len(toks))
        return toks

    def _read_field(self, toks: list[int]) -> str | None:
        s = "".join(CHARS[t] for t in toks).lstrip("_")
        return s if s.isdigit() and (s == "0" or not s.startswith("0")) else None

    def decode_input(self, tokens: torch.Tensor) -> tuple[list[int], int] | None:
        t = tokens.tolist()
        nums = [self._read_field(t[i * self.W:(i + 1) * self.W]) for i in range(self.k + 1)]
        if any(x is None for x in nums):
            return None
        return [int(x) for x in nums[:-1]], int(nums[-1])

    def decode_output(self, tokens: torch.Tensor) -> str:
        """The public-format text of the output part; malformed slots come out raw (and fail to parse)."""
        t = [v if 0 <= v < len(CHARS) else PAD for v in tokens.tolist()]
        W, eqs = self.W, []
        for s in range(self.k - 1):
            sl = t[self.n_in + s * self.slot: self.n_in + (s + 1) * self.slot]
            if all(v == PAD for v in sl):
                continue
            a, b, c = self._read_field(sl[:W]), self._read_field(sl[W + 1:2 * W + 1]), self._read_field(sl[-W:])
            op, eq = sl[W], sl[2 * W + 1]
            if a is None or b is None or c is None or not 10 <= op < 14 or eq != EQ:
                eqs.append("?" + "".join(CHARS[v] for v in sl))  # '?' never parses: a bad layout never scores
            else:
                eqs.append(f"{a}{OPS[op - 10]}{b}={c}")
        return ",".join(eqs)

    # ---- data ------------------------------------------------------------------------------
    def _data_key(self) -> str:
        d = self.cfg.model_dump(exclude={"n_val"})  # train and test never depend on val
        blob = json.dumps({"v": 1, **d}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def prepare(self, cache_dir: str | None) -> None:
        if self.train_x0 is not None:
            return
        path = os.path.join(cache_dir, f"countdown{self.k}-{self._data_key()}.npz") if cache_dir else None
        data = cached_npz(path, lambda: generate_split(self.cfg))
        self._data_path = path
        self.train_x0 = self._tokens(data, "train")
        test = self._tokens(data, "test")
        self.test = EvalSet(test, self.cond_mask().expand_as(test).clone())

    def _tokens(self, data: dict[str, np.ndarray], split: str) -> torch.Tensor:
        return torch.tensor([self.encode(o, t, s) for o, t, s in zip(
            data[f"{split}_operands"].tolist(), data[f"{split}_targets"].tolist(), data[f"{split}_steps"].tolist())],
            dtype=torch.long)

    @functools.cached_property
    def val(self) -> EvalSet:
        """The n_val instances after the test ones (made, and cached beside the data, on first use)."""
        data = cached_npz(val_path(self._data_path, self.cfg.val_size), lambda: {
            k: v for k, v in generate_split(self.cfg, val=True).items() if k.startswith("val_")})
        val = self._tokens(data, "val")
        return EvalSet(val, self.cond_mask().expand_as(val).clone())

    def train_batch(self, batch_size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.train_x0.shape[0], (batch_size,), generator=gen)
        x0 = self.train_x0[idx]
        return x0, self.cond_mask().expand_as(x0).clone()

    def eval_set(self, split: str = "test") -> EvalSet:
        return self.test if self.cfg.split_of(split) == "test" else self.val

    def max_examples(self) -> DataBound:
        """The distinct (operand multiset, target) instances the generator can make (train, test and val
        are disjoint by them; training has no augmentation)."""
        c = self.cfg
        count, exact = count_instances(c)
        return DataBound(count, f"distinct (operand multiset, target) instances with {c.n_operands} operands in "
                                f"{c.operand_min}..{c.operand_max}, targets {c.target_min}..{c.target_max}, "
                                f"ops {c.ops!r}, results <= {c.max_value}", exact=exact)

    # ---- scoring ---------------------------------------------------------------------------
    def score(self, output: torch.Tensor, ev: EvalSet) -> list[dict[str, float]]:
        rows = []
        for o, r in zip(output.cpu(), ev.x0.cpu()):
            inp = self.decode_input(r)
            if inp is None:
                raise ValueError(f"reference input does not decode: {self.render(r, self.cond_mask())!r}")
            text, ref = self.decode_output(o), self.decode_output(r)
            ok, _ = check_solution(inp[0], inp[1], text)
            # the input part of the output must be the given input (the sampler never changes it)
            same_input = bool((o[: self.n_in] == r[: self.n_in]).all())
            rows.append({"rtr": float(ok and same_input), "well_formed": float(well_formed(text)),
                         "ends_on_target": float(last_result(text) == inp[1]), "exact": float(text == ref)})
        return rows

    def render(self, tokens: torch.Tensor, cond: torch.Tensor | None = None) -> str:
        """With `cond`: the input in public format (`15,44,79,50`); without: the output (`44-15=29,...`)."""
        if cond is not None:
            inp = self.decode_input(tokens)
            return format_input(*inp) if inp else "".join(CHARS[v] if 0 <= v < len(CHARS) else "?"
                                                          for v in tokens[: self.n_in].tolist())
        return self.decode_output(tokens)

    def rescore(self, input_text: str, output_text: str, reference_text: str | None) -> dict[str, float]:
        operands, target = parse_input(input_text)
        ok, _ = check_solution(operands, target, output_text)
        scores = {"rtr": float(ok), "well_formed": float(well_formed(output_text)),
                  "ends_on_target": float(last_result(output_text) == target)}
        if reference_text is not None:
            scores["exact"] = float(output_text == reference_text)
        return scores
