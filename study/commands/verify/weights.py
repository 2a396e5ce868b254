"""A done run's final weights: present, this project's (loaded without running code), the bytes its runs row
recorded (field weights_sha256, store/digest.py), and of the shapes its config makes. Read without torch
(model/checkpoint_meta.py: the same refusals as torch.load(weights_only=True), tensors as shapes only);
`--deep` loads them with torch to evaluate again."""
from __future__ import annotations

from model.checkpoint_meta import CheckpointError, read_state_meta
from model.costs import param_shapes
from store.digest import weights_mismatch
from study.commands.verify.context import Context


def check_weights(c: Context) -> None:
    """Each done run's weights, read without torch (read_state_meta)."""
    from study.engine.rows import STATE_KEYS

    store, v = c.store, c.v
    for rid, row in sorted(c.runs.items()):
        if row["status"] != "done":
            continue
        v.add("done")
        wpath = store.weights_path(rid)
        data = store.read_bytes(wpath)
        if data is None:
            v.problems.append(f"run {rid} is done but has no weights ({wpath})")
            continue
        try:
            sd = read_state_meta(data, wpath)
            lacking = [k for k in STATE_KEYS if k not in sd]
            if lacking:
                raise CheckpointError(f"{wpath}: not this project's weights (no {', '.join(lacking)})")
            v.add("weights")
        except CheckpointError as e:
            v.problems.append(f"{e}; `study run` sets it aside and retrains the run")
            continue
        if row.get("weights_sha256") is None:
            v.problems.append(f"{store.path('runs', f'{rid}.parquet')}: field weights_sha256 is empty: run {rid} "
                              f"is done and its weights are there")
        bad = weights_mismatch(wpath, data, row)
        if bad:
            v.problems.append(f"{bad}; `study run` sets it aside and retrains the run")
        _check_shapes(c, rid, wpath, sd["model"])


def expected_shapes(run, task) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model a run's config makes (model.costs.param_shapes: no torch)."""
    return param_shapes(run.model, task.vocab_size, task.pos_sizes())


def _check_shapes(c: Context, rid: str, wpath: str, got) -> None:
    """The weights' tensors are the ones run `rid`'s config makes: the same names, each of the same shape."""
    run = c.rebuilt.get(rid)
    if run is None:
        c.v.underived.add("weights' shapes of runs whose config is unusable")
        return
    try:
        want = expected_shapes(run, c.task_of(c.runs[rid]))
    except (ValueError, TypeError) as e:
        c.v.problems.append(f"run {rid}: task not rebuilt from its runs row: {str(e).splitlines()[0][:160]}")
        return
    m = run.model
    shape = f"K {m.K}, L {m.L}, d_model {m.d_model}"
    if not isinstance(got, dict):
        c.v.problems.append(f"{wpath}: field model is not a state dict of tensors")
        return
    names = set(got)
    for k in sorted(names ^ set(want))[:1]:
        where = "holds" if k in names else "lacks"
        c.v.problems.append(f"{wpath}: field model {where} parameter {k}: not the model run {rid}'s config ({shape}) "
                            f"makes ({len(names)} tensors, the config makes {len(want)}): another run's weights?")
    for k in sorted(names & set(want)):
        s = tuple(getattr(got[k], "shape", ()))
        if s != want[k]:
            c.v.problems.append(f"{wpath}: field model.{k} has shape {s}, the model run {rid}'s config ({shape}) "
                                f"makes {want[k]}: another run's weights?")
            break
