"""The `claims:` and `seeds:` sections (study/spec/claims.py): validated like every section, each claim
resolved to the grid's models and their seeded runs."""
from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from study.cli import app
from study.spec.grid import GridError, expand
from tests.helpers import tiny_grid

BASE = tiny_grid("cl", retries=None, axes=None, extra="""couple:
  - [{K: 1, L: 2}, {K: 1, L: 1}, {K: 2, L: 1}]
seeds: {min: 2, max: 4, batch: 1}""")
CLAIMS = """claims:
  - {pair: iso-param, T: [1, 2], claim: beats}
  - {pair: iso-flop, T: [2], claim: matches_or_beats, margin: 0.05}
  - {A: {K: 1, L: 2}, B: {K: 2, L: 1}, T: [1], metric: vpr, claim: matches, margin: 0.1}
"""


def grid_of(text: str):
    return expand(yaml.safe_load(text), "g.yaml")


def test_claims_resolve_to_pairs_and_seeded_runs():
    g = grid_of(BASE + CLAIMS)
    names = [c["name"] for c in g.claims.claims]
    assert names == ["(1 x 2) beats (1 x 1) at T=1", "(1 x 2) beats (1 x 1) at T=2",
                     "(1 x 2) matches_or_beats (2 x 1) at T=2", "(1 x 2) matches (2 x 1) at T=1"]
    assert len(g.runs) == 3 * 2  # three models at the first two seeds
    assert sorted({r.train.seed for r in g.runs}) == [0, 1]
    spec = g.claims.spec()
    runs = spec["claims"][0]["A"]["runs"]
    assert len(runs) == 4 and len(set(runs)) == 4  # a run id per seed, up to max
    assert set(r.run_id for r in g.runs) <= {x for c in spec["claims"] for s in "AB" for x in c[s]["runs"]}
    assert spec["claims"][0]["metric"] == "vpr"


@pytest.mark.parametrize("claims, words", [
    ("claims:\n  - {pair: iso-param, T: [1], claim: matches}", ("claims[0].margin", "needs its margin")),
    ("claims:\n  - {pair: iso-param, T: [1], claim: beats, colour: red}", ("claims[0].colour", "unknown key",
                                                                         "allowed:")),
    ("claims:\n  - {pair: iso-loop, T: [1], claim: beats}", ("claims[0].pair", "iso-param", "iso-flop")),
    ("claims:\n  - {pair: iso-param, T: [3], claim: beats}", ("claims[0].T", "T=3")),
    ("claims:\n  - {pair: iso-param, T: [1], claim: beats, metric: nll}", ("claims[0].metric", "vpr")),
    ("claims:\n  - {A: {K: 3, L: 1}, B: {K: 1, L: 1}, T: [1], claim: beats}", ("claims[0].A", "no model")),
    ("claims:\n  - {pair: iso-param, T: [1], claim: wins}", ("claims[0].claim", "beats")),
    ("claims:\n  - {pair: iso-param, T: [1], claim: beats, margin: 0.1}", ("claims[0].margin", "no margin")),
])
def test_bad_claims_are_one_line_naming_key(claims, words):
    with pytest.raises(GridError) as e:
        grid_of(BASE + claims)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("g.yaml: key '")
    for w in words:
        assert w in msg, (w, msg)


def test_pair_the_grid_does_not_hold():
    text = BASE.replace("{K: 1, L: 2}, {K: 1, L: 1}, {K: 2, L: 1}", "{K: 1, L: 2}, {K: 2, L: 1}")
    with pytest.raises(GridError, match=r"claims\[0\].pair.*no iso-param pair"):
        grid_of(text + "claims:\n  - {pair: iso-param, T: [1], claim: beats}")


@pytest.mark.parametrize("seeds, words", [
    ("{min: 3, max: 2}", ("seeds.max", ">= min")), ("{min: 1}", ("seeds.min",)), ("{mn: 2}", ("seeds.mn", "unknown")),
])
def test_bad_seeds(seeds, words):
    text = BASE.replace("seeds: {min: 2, max: 4, batch: 1}", f"seeds: {seeds}")
    with pytest.raises(GridError) as e:
        grid_of(text + CLAIMS)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_seed_axis_and_seeds_without_claims_are_refused():
    with pytest.raises(GridError, match="seeds.*needs a `claims:`"):
        grid_of(BASE)
    with pytest.raises(GridError, match="remove the seed axis"):
        grid_of(BASE + CLAIMS + "axes: {seed: [0, 1]}\n")


def test_cli_exit_2_one_line(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text(BASE + "claims:\n  - {pair: iso-flop, T: [1], claim: matches}\n")
    r = CliRunner().invoke(app, ["plan", str(p)])
    assert r.exit_code == 2, r.output
    assert "claims[0].margin" in r.output and str(p) in r.output and len(r.output.strip().splitlines()) == 1


def _evals(spec: dict, diffs: list[float], b: list[float] | None = None, n: int | None = None):
    """An evals table holding, at the first claim's point, seed i's A value 0.5 + diffs[i] and B value 0.5; or,
    given `b`, A's values `diffs` and B's `b`, rates over `n` examples."""
    import pandas as pd

    c = spec["claims"][0]
    a = diffs if b is not None else [0.5 + d for d in diffs]
    b = b if b is not None else [0.5] * len(diffs)
    rows = []
    for i, (x, y) in enumerate(zip(a, b)):
        for side, v in (("A", x), ("B", y)):
            s = c[side]
            rows.append({"run_id": s["runs"][i], "T": c["T"], "L_s": s["L_s"], "sampler": s["sampler"],
                         "split": s["split"], "metric": c["metric"], "value": v, "n_examples": n})
    return pd.DataFrame(rows)


def _spec(text: str = "claims:\n  - {pair: iso-param, T: [1], claim: beats}\n", big: bool = True) -> dict:
    return grid_of((BASE.replace("max: 4", "max: 8") if big else BASE) + text).claims.spec()


@pytest.mark.parametrize("n, k", [(24, 2), (40, 2), (500, 8)])
def test_seed_differences_equal_within_the_resolution_are_tied(n, k):
    """Issue 42: A 0/n vs B 1/n and A k/n vs B (k + 1)/n differ by the same count, but their float differences
    do not (-0.041666666666666664 and -0.04166666666666667 at n = 24): tied, undecided and not final at the
    first look, where exact equality gave an interval of width 1e-16 and "refuted, final" at 2 seeds."""
    from analysis.claims import evaluate

    spec = _spec()
    assert 0 / n - 1 / n != k / n - (k + 1) / n
    r = evaluate(spec, _evals(spec, [0 / n, k / n], [1 / n, (k + 1) / n], n)).iloc[0]
    assert r["decision"] == "undecided (more seeds)" and not r["final"] and "no spread" in r["why"]
    assert r["seq_low"] != r["seq_low"] and r["fixed_says"] == "undecided"  # no interval: nan
    # a difference of one count is no tie: the same seeds with B's second at 4/n have a spread
    r = evaluate(spec, _evals(spec, [0 / n, k / n], [1 / n, (k + 2) / n], n)).iloc[0]
    assert r["seq_low"] < r["difference"] < r["seq_high"]


def test_constant_arms_stop_at_the_first_look_saying_why():
    from analysis.claims import evaluate

    spec = _spec()
    r = evaluate(spec, _evals(spec, [0.0, 0.0], [0.0, 0.0], 40)).iloc[0]
    assert r["decision"] == "undecided" and r["final"] and r["seeds"] == 2
    assert r["why"] == "constant: every seed of A scored 0, of B 0; stopped at 2 of 8 seeds", r["why"]


def test_a_futile_claim_stops_undecided_and_a_promising_one_goes_on():
    from analysis.claims import evaluate
    from stats.sequential import FUTILE, chance, design

    spec = _spec()
    futile = [0.05, 0.03, -0.05]  # promising at 2 seeds; mean 0.01, s.d. 0.053 at 3: no decision by 8 in reach
    r = evaluate(spec, _evals(spec, futile)).iloc[0]
    assert r["decision"] == "undecided" and r["final"] and r["seeds"] == 3
    assert r["why"].startswith("futile: a 0% chance of a decision by 8 seeds; stopped at 3 of 8"), r["why"]
    d = design(2, 8, 1)
    assert chance("beats", None, 0.01, 0.0529, 3, d) < FUTILE < 0.99 < chance("beats", None, 0.05, 0.03, 3, d)
    r = evaluate(spec, _evals(spec, [0.05, 0.02, 0.08])).iloc[0]  # 0.05 +- 0.03: the last look likely decides
    assert r["decision"] == "undecided (more seeds)" and not r["final"]


def test_claims_alpha_family_by_default_per_claim_on_request():
    from analysis.claims import design_of, evaluate

    two = "claims:\n  - {pair: iso-param, T: [1, 2], claim: beats}\n"
    fam, per = _spec(two), _spec(two + "claims_alpha: per-claim\n")
    assert fam["claims_alpha"] == "family" and per["claims_alpha"] == "per-claim"
    assert design_of(fam).alpha == pytest.approx(0.025) and design_of(per).alpha == 0.05
    assert design_of(fam).crit[-1] > design_of(per).crit[-1]
    diffs = [0.30, 0.32, 0.29, 0.31, 0.33]
    m_fam = evaluate(fam, _evals(fam, diffs)).iloc[0]["method"]
    m_per = evaluate(per, _evals(per, diffs)).iloc[0]["method"]
    assert "family-wise: 5% for all 2 claims together (Bonferroni: each at 0.025)" in m_fam
    assert "repeated 97.5% t intervals" in m_fam and "repeated 95% t intervals" in m_per
    assert "per claim (claims_alpha: per-claim): 5% each, not for the 2 together" in m_per


def test_bad_claims_alpha_is_one_line_naming_file_key_and_values():
    with pytest.raises(GridError) as e:
        grid_of(BASE + CLAIMS + "claims_alpha: familywise\n")
    assert "\n" not in str(e.value)
    assert str(e.value) == "g.yaml: key 'claims_alpha': must be one of family, per-claim (got 'familywise')"
    with pytest.raises(GridError, match="claims_alpha.*needs a `claims:`"):
        grid_of(BASE.replace("seeds: {min: 2, max: 4, batch: 1}\n", "") + "claims_alpha: family\n")


def test_claims_decided_from_evals_and_the_next_seeds():
    from analysis.claims import evaluate, plan_lines
    from study.engine.claims import next_seeds

    g = grid_of(BASE.replace("max: 4", "max: 8") + "claims:\n  - {pair: iso-param, T: [1], claim: beats}\n")
    spec = g.claims.spec()
    big = [0.30, 0.32, 0.29, 0.31, 0.33]  # a large, steady gain: decided before max
    t = evaluate(spec, _evals(spec, big))
    r = t.iloc[0]
    assert r["decision"] == "supported" and r["final"] and 2 <= r["seeds"] <= 5 and r["seq_low"] > 0
    assert r["fixed_says"] == "supported" and r["fixed_low"] > r["seq_low"]  # the fixed interval is narrower
    noisy = [0.05, -0.02]
    t = evaluate(spec, _evals(spec, noisy))
    assert t.iloc[0]["decision"] == "undecided (more seeds)" and not t.iloc[0]["final"]
    owed = {m: 2 for m in g.claims.models}
    assert set(next_seeds(t, spec, owed).values()) == {3}  # batch 1: the next look
    lines = plan_lines(spec, _evals(spec, noisy), reps=200)
    assert "pilot of 2 seeds" in lines[1] and "P(decided within 8)" in lines[1]
    assert "no pilot" in plan_lines(spec, None, reps=200)[1]


def test_lower_is_better_metric_is_oriented():
    from analysis.claims import differences

    g = grid_of(BASE + "claims:\n  - {pair: iso-param, T: [1], claim: beats}\n")
    c = dict(g.claims.spec()["claims"][0], lower_is_better=True)
    ev = _evals({"claims": [c]}, [0.1, 0.2])
    assert differences(c, ev) == pytest.approx([-0.1, -0.2])


def test_a_larger_max_keeps_the_seeds_already_run():
    """A rerun with a larger seeds.max owes the same runs for the seeds it has (found done) and more after."""
    small = grid_of(BASE + CLAIMS).claims.spec()
    large = grid_of(BASE.replace("max: 4", "max: 6") + CLAIMS).claims.spec()
    for a, b in zip(small["claims"], large["claims"]):
        assert b["A"]["runs"][:4] == a["A"]["runs"] and len(b["A"]["runs"]) == 6
        assert b["B"]["runs"][:4] == a["B"]["runs"]


def _fake_engine(tmp_path, monkeypatch, evals_of):
    """run_claims with the runner, Ray and the store's evaluations faked: (runs done, seeds per round, Ray starts
    (1) and shutdowns (-1)); evals_of(spec) gives the evaluations of every seed (those done are served)."""
    import contextlib
    import types

    import study.engine.claims as engine_claims
    import study.engine.runner as runner

    done: set[str] = set()
    rounds: list[int] = []
    rays: list[int] = []

    def fake_run_grid(grid, store, results, options, lease, hold=None):  # Ray through the runner's one path
        todo = [r for r in grid.runs if r.run_id not in done]
        with runner.ray_for(grid, store, todo, options, hold) if todo else contextlib.nullcontext():
            done.update(r.run_id for r in grid.runs)
        rounds.append(len({r.train.seed for r in grid.runs}))
        return 0

    ray, up = types.SimpleNamespace(shutdown=lambda: (rays.append(-1), up.clear()),
                                    cluster_resources=lambda: {"CPU": 1}), []

    def fake_init_ray(*a, **k):  # as Ray's: a call while Ray is up joins it (started False)
        if up:
            return ray, False
        rays.append(1)
        up.append(1)
        return ray, True

    def fake_load_study(results, name):
        ev = evals_of(engine_claims.json.loads(open(tmp_path / "res" / name / "claims.json").read()))
        return types.SimpleNamespace(evals=ev[ev.run_id.isin(done)])

    monkeypatch.setattr(runner, "run_leased", fake_run_grid)
    monkeypatch.setattr(engine_claims, "load_study", fake_load_study)
    monkeypatch.setattr(runner, "init_ray", fake_init_ray)
    monkeypatch.setattr(runner, "sigterm_as_ctrl_c", lambda: None)
    monkeypatch.setattr(runner, "refuse_unplaceable", lambda *a: False)
    return done, rounds, rays


def test_a_rerun_with_a_larger_max_goes_on_from_where_it_stopped(tmp_path, monkeypatch):
    """run_claims itself (the runner and the store's evaluations faked): a run with max 4 spends its looks up to
    4 seeds, undecided; a rerun with max 6 finds those 4 seeds, owes the next look (5) at once, not 3 again, and
    goes on to 6. One Ray serves every round; each round names the claims still open."""
    import stats.sequential
    import study.engine.claims as engine_claims
    from study.engine.options import RunOptions

    noisy = [0.05, -0.02, 0.03, -0.01, 0.02, 0.0]  # small and spread: undecided at every look
    done, rounds, rays = _fake_engine(tmp_path, monkeypatch,
                                      lambda spec: _evals(spec, noisy[:len(spec["claims"][0]["A"]["runs"])]))
    monkeypatch.setattr(stats.sequential, "FUTILE", 0.0)  # the seeds' bookkeeping: no claim stops as futile
    text = BASE + "claims:\n  - {pair: iso-param, T: [1], claim: beats}\n"
    said: list[str] = []
    opts = RunOptions(echo=said.append)
    assert engine_claims.run_claims(grid_of(text), str(tmp_path / "res"), opts) == 0
    assert rounds == [2, 3, 4] and "undecided" in said[-2]
    assert rays == [1, -1]  # one Ray for the three rounds, shut down once at the end (issue 44)
    opened = [x for x in said if x.startswith("claims round")]
    assert all("1 of 1 claims open ((1 x 2) beats (1 x 1) at T=1)" in x for x in opened), opened
    assert "claims: 8 runs, 100% of a fixed 4-seed design of the same models (8 runs)" in said
    first = set(done)
    rounds.clear()
    assert engine_claims.run_claims(grid_of(text.replace("max: 4", "max: 6")), str(tmp_path / "res"), opts) == 0
    assert rounds == [2, 5, 6], rounds  # round 1 finds the min seeds, the 4 run before make the next look 5
    assert first < done and len(done - first) == 2 * 2  # seeds 5 and 6 of the claim's two models, nothing again


def test_a_grid_whose_models_did_not_learn_stops_at_its_first_look(tmp_path, monkeypatch):
    """Issue 42/44: every model at VPR 0 on every seed: one round (2 seeds), one line saying so, each claim
    "constant", where the loop spent every seed up to max before."""
    import study.engine.claims as engine_claims
    from study.engine.options import RunOptions

    zeros = lambda spec: pd_concat([_evals({"claims": [c]}, [0.0] * 8, [0.0] * 8, 16)  # noqa: E731
                                    for c in spec["claims"]])
    _, rounds, rays = _fake_engine(tmp_path, monkeypatch, zeros)
    said: list[str] = []
    grid = grid_of(BASE.replace("max: 4", "max: 8") + CLAIMS)
    assert engine_claims.run_claims(grid, str(tmp_path / "res"), RunOptions(echo=said.append)) == 0
    assert rounds == [2] and rays == [1, -1]
    assert ("claims: every model scored the same on every seed at each claim's point (did they learn?): nothing "
            "to decide, stopped at the first look") in said
    assert "claims: 6 runs, 25% of a fixed 8-seed design of the same models (24 runs)" in said
    rows = [said[i - 1] + " " + x.strip() for i, x in enumerate(said)  # a claim's line, then why it stopped
            if "constant: every seed of A scored 0, of B 0; stopped at 2 of 8 seeds" in x]
    assert len(rows) == 4, said
    # margins as stored and as the API gives them (0.05, not 5.0 points: issue 44)
    assert [x.split()[9] for x in rows if "matches_or_beats" in x] == ["0.05"], rows


def pd_concat(frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True).drop_duplicates(["run_id", "T", "L_s", "sampler", "split", "metric"])


def test_claims_and_the_analysis_agree_on_the_fields_that_only_shape_the_loop():
    # two copies (study/spec stays free of pandas, which analysis.tables imports): an iso-FLOP pair of claims
    # must drop exactly the fields the report's iso-FLOP pairs drop
    from analysis.tables import LOOP_ONLY_FIELDS
    from study.spec.claims import LOOP_ONLY

    assert LOOP_ONLY == LOOP_ONLY_FIELDS
