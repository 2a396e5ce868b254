"""The study's Optuna searches, read for `--figure tuning` (analysis/figures/tuning.py) and the report's
importances table.

`study tune` keeps its Optuna storage in the study directory as `optuna.*`: an SQLite file
(`optuna.db`, `.sqlite`, `.sqlite3`) or an Optuna journal file (any other `optuna.*`, e.g.
`optuna.journal`, `optuna.log`). The storage may hold several Optuna studies (one search per
group); each gets its own row of panels. Read-only: nothing here writes to the storage.
"""
from __future__ import annotations

import os

import pandas as pd

from analysis.load import MissingData

SQLITE_MAGIC = b"SQLite format 3\x00"


def find_storage(study_dir: str) -> str | None:
    """Path of the study's Optuna storage file, or None."""
    if not os.path.isdir(study_dir):
        return None
    names = sorted(n for n in os.listdir(study_dir) if n.startswith("optuna.") and not n.endswith((".lock", "-journal"))
                   and os.path.isfile(os.path.join(study_dir, n)))
    return os.path.join(study_dir, names[0]) if names else None


IMPORTANCE_METHOD = "PED-ANOVA"  # optuna.importance.PedAnovaImportanceEvaluator, asked for by name


def load_searches(study_dir: str) -> list[tuple[str, pd.DataFrame, dict[str, float], str]]:
    """[(optuna study name, completed trials (number, value, best_so_far, params...), importances, direction)]."""
    path = find_storage(study_dir)
    if path is None:
        raise MissingData(f"no Optuna study at {study_dir}/optuna.* (run `study tune GRID` first)")
    import optuna  # after the check: importing it is a quarter second a study without a search need not pay
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    with open(path, "rb") as f:
        sqlite = f.read(16) == SQLITE_MAGIC
    storage = optuna.storages.RDBStorage(f"sqlite:///{os.path.abspath(path)}") if sqlite else \
        JournalStorage(JournalFileBackend(path))
    out = []
    for name in optuna.study.get_all_study_names(storage):
        st = optuna.load_study(study_name=name, storage=storage)
        if len(st.directions) != 1:
            continue  # multi-objective searches have no single optimization history
        direction = st.direction.name.lower()
        done = [t for t in st.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
        if not done:
            continue
        df = pd.DataFrame([{"number": t.number, "value": t.value, **t.params} for t in done]).sort_values("number")
        best = df["value"].cummin() if direction == "minimize" else df["value"].cummax()
        df.insert(2, "best_so_far", best)
        imp: dict[str, float] = {}
        varied = [p for p in df.columns[3:] if df[p].nunique() > 1]
        if len(done) >= 2 and varied:
            # named, not the version's default (fANOVA up to Optuna 4, PED-ANOVA from 5), so the label
            # says what was computed; fANOVA would also need scikit-learn
            imp = optuna.importance.get_param_importances(
                st, params=varied, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
        out.append((name, df.reset_index(drop=True), dict(imp), direction))
    if not out:
        raise MissingData(f"the Optuna storage {path} holds no completed single-objective trial")
    return out


def importances_table(searches) -> pd.DataFrame:
    rows = [{"search": name, "parameter": p, "importance": v, "method": IMPORTANCE_METHOD}
            for name, _, imp, _ in searches for p, v in imp.items()]
    return pd.DataFrame(rows, columns=["search", "parameter", "importance", "method"])

