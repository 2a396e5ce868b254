"""The two-step law's input: one frame of every
finished run's final point and its checkpoints, from the store's tables.

Columns: run_id, K, L, d_model, N (non-embedding parameters), D (steps x batch; step x batch at a
checkpoint), step, is_checkpoint, split, elbo, elbo_se, ref_nll, ref_nll_se, n_examples and vpr_T<T>
per T. A final point takes its ELBO and reference NLL from the evals rows of `split` (metric "elbo",
"ref_nll", sampler "likelihood") and its VPR at each T from the rate rows at L_s = L_t; a checkpoint
takes them from its history row's `val` JSON (val_elbo, val_ref_nll, val_vpr_T<T>) on the validation
split, with n_examples the run's validation evaluation's (its t interval, when there, gives the se).
se = (ci_high - ci_low) / (2 x 1.96): the interval is a t interval over examples, close to normal here.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from analysis.ladder.law import LadderError
from analysis.load import StudyData

Z95 = 1.959964


def _se(row) -> float:
    lo, hi = row.get("ci_low"), row.get("ci_high")
    return float((hi - lo) / (2 * Z95)) if lo is not None and hi is not None and np.isfinite(hi - lo) else np.nan


def ladder_frame(runs: pd.DataFrame, evals: pd.DataFrame, history: pd.DataFrame, split: str = "test") -> pd.DataFrame:
    """The frame above, from the runs, evals and history tables (finished runs only)."""
    done = runs[runs["status"] == "done"].set_index("run_id")
    rows = []
    for rid, r in done.iterrows():
        ev = evals[evals["run_id"] == rid]
        base = {"run_id": rid, "K": int(r["K"]), "L": int(r["L_t"]), "d_model": int(r["d_model"]),
                "N": float(r["n_params_non_embedding"])}
        fin = {**base, "D": float(r["steps"]) * float(r["batch"]), "step": int(r["steps"]), "is_checkpoint": False,
               "split": split}
        cont = ev[(ev["split"] == split) & (ev["sampler"] == "likelihood")]
        for m in ("elbo", "ref_nll"):
            got = cont[cont["metric"] == m]
            fin[m] = float(got["value"].iloc[0]) if len(got) else np.nan
            fin[f"{m}_se"] = _se(got.iloc[0].to_dict()) if len(got) else np.nan
        rate = ev[(ev["split"] == split) & (ev["metric"] == "vpr") & (ev["L_s"] == r["L_t"])
                  & (ev["sampler"] != "likelihood")]
        for T, g in rate.groupby("T"):
            fin[f"vpr_T{int(T)}"] = float(g["value"].iloc[0])
        fin["n_examples"] = int(rate["n_examples"].iloc[0]) if len(rate) else np.nan
        rows.append(fin)
        val = ev[(ev["split"] == "val") & (ev["metric"] == "elbo")]
        n_val = int(val["n_examples"].iloc[0]) if len(val) else np.nan
        val_se_rel = (_se(val.iloc[0].to_dict()) / float(val["value"].iloc[0])) if len(val) else np.nan
        for h in history[(history["run_id"] == rid) & history["val"].notna()].to_dict("records"):
            v = json.loads(h["val"])
            if "val_elbo" not in v or int(h["step"]) >= int(r["steps"]):
                continue
            ck = {**base, "D": float(h["step"]) * float(r["batch"]), "step": int(h["step"]), "is_checkpoint": True,
                  "split": "val", "elbo": float(v["val_elbo"]), "ref_nll": float(v.get("val_ref_nll", np.nan)),
                  "n_examples": n_val}
            ck["elbo_se"] = ck["elbo"] * val_se_rel  # the checkpoint keeps no interval: the final val one's, relative
            ck["ref_nll_se"] = np.nan
            for k, x in v.items():
                if k.startswith("val_vpr_T"):
                    ck[k[len("val_"):]] = float(x)
            rows.append(ck)
    return pd.DataFrame(rows)


MIN_MODELS = 4


def study_frame(data: StudyData, split: str = "test") -> pd.DataFrame:
    """The two-step frame of a study's done runs (final points on `split`), or LadderError naming `study backfill` when runs lack
    the test ELBO (stores written before the continuous quantities were kept)."""
    evals = pd.concat([data.evals, data.continuous], ignore_index=True) if data.continuous is not None else data.evals
    f = ladder_frame(data.runs, evals, data.history, split=split)
    fin = f[~f["is_checkpoint"]] if len(f) else f
    lacking = sorted(fin.loc[fin["elbo"].isna(), "run_id"]) if len(fin) else []
    if lacking or not len(fin):
        raise LadderError(f"--law two-step: {len(lacking)} of {len(fin)} runs of study '{data.name}' lack the "
                          f"test ELBO (eval key nll-test; first {lacking[0] if lacking else '-'}): score them with "
                          f"`study backfill --study {data.name}`")
    steps = f.groupby("run_id")["step"].transform("max")
    many = steps.nunique() > 1  # a steps axis: the label names the model's training steps too
    return f.assign(label=[f"({k} x {lp}) d={d}" + (f" s={s}" if many else "")
                           for k, lp, d, s in zip(f["K"], f["L"], f["d_model"], steps)])


def split_holdout(f: pd.DataFrame, hold_out: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ladder frame, held-out final points): 'largest' holds out the largest N, 'widest' the largest width,
    a run id its model (every run of that label)."""
    labels = set()
    for h in hold_out:
        if h == "largest":
            labels |= set(f.loc[f["N"] == f["N"].max(), "label"])
        elif h == "widest":
            labels |= set(f.loc[f["d_model"] == f["d_model"].max(), "label"])
        elif h in set(f["run_id"]):
            labels |= set(f.loc[f["run_id"] == h, "label"])
        else:
            raise LadderError(f"--hold-out {h}: no run '{h}' in the ladder (a run id, 'largest' or 'widest')")
    held = f["label"].isin(labels)
    lad = f[~held]
    if lad["label"].nunique() < MIN_MODELS:
        raise LadderError(f"too few runs to fit the two-step law: {lad['label'].nunique()} models left after the "
                          f"hold-out, at least {MIN_MODELS} models are needed")
    return lad, f[held & ~f["is_checkpoint"]]
