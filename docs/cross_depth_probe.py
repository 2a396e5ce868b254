"""Eval-time probe behind docs/REPRODUCTION.md's cross-depth section: no training, only the stored
final weights of a study's runs, sampled again with the step embedding's position s of each loop
chosen three ways, and the hidden state's size per loop.

    python docs/cross_depth_probe.py --study cpu_cross_depth [--results results] [--T 8] [--L-s 3 4 6]

s maps, for loop l (1-based) of L_s:
  paper   s = (l-1)/(L_s-1)              what the model does (model/rmdm.py loop_position)
  grid3   s = min((l-1)/2, 1)            the values a depth-3 training step uses (0, .5, 1), then 1
  grid2   s = min(l-1, 1)                the values a depth-2 training step uses (0, 1), then 1
At L_s <= 3 `paper` and `grid3` are the same positions. A model whose deep sampling recovers under
grid3 / grid2 fails because of s values it never saw in training; one that fails under every map
fails because iterating its block drifts. Sampled as the study's own evaluation (seed 0, the run's
precision), so `paper` repeats the evals table's numbers. Prints one line per (run, map, L_s): VPR with its Wilson
interval, and the root-mean-square of h after each loop (first 256 puzzles, last denoising step's input).
Writes nothing to the store.
"""
from __future__ import annotations

import argparse
import sys

import torch

import model.rmdm as rmdm
from model.rmdm import sample_all
from stats import wilson
from store import Store
from study.commands.puzzles import load_run_model

MAPS = {
    "paper": lambda l, n: 0.0 if n == 1 else (l - 1) / (n - 1),
    "grid3": lambda l, n: min((l - 1) / 2, 1.0),
    "grid2": lambda l, n: min(float(l - 1), 1.0),
}


def hidden_rms(model, x, n_loops: int) -> list[float]:
    with torch.no_grad():
        x_emb = model.embed(x)
        h, out = x_emb, []
        for l in range(1, n_loops + 1):
            h = model.loop(h, x_emb, l, n_loops)
            out.append(float(h.pow(2).mean().sqrt()))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True)
    ap.add_argument("--results", default="results")
    ap.add_argument("--T", type=int, default=8)
    ap.add_argument("--L-s", type=int, nargs="+", default=[3, 4, 6])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--runs", nargs="*", help="run ids (default: every run with final weights)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    store = Store(a.results, a.study)
    runs = store.read("runs")
    if runs.empty:
        print(f"{a.study}: no finished runs", file=sys.stderr)
        return 1
    runs = runs.sort_values("created_at").drop_duplicates("run_id", keep="last")
    ids = a.runs or list(runs["run_id"])
    original = rmdm.loop_position
    try:
        for rid in ids:
            cfg, task, model = load_run_model(store, rid)
            model.eval()
            with store.task_data() as data_dir:
                task.prepare(data_dir)
            ev = task.eval_set("test").head(a.n)
            tr, m = cfg["train"], cfg["model"]
            # sampled in the precision the run's own evaluation used (the trainer's choice on its machine)
            prec = runs.set_index("run_id")["precision"].get(rid) or "float32"
            name = (f"{rid} {tr['schedule']} step_emb={m['step_emb']} min_lr_ratio={tr['min_lr_ratio']} "
                    f"min_depth={tr['min_depth']} seed={tr['seed']}")
            for mname, fn in MAPS.items():
                rmdm.loop_position = fn
                for L_s in a.L_s:
                    if mname != "paper" and L_s <= (3 if mname == "grid3" else 2):
                        continue  # the same positions as `paper`
                    got = sample_all(model, ev.x0, ev.cond, T=a.T, L_s=L_s, seed=0, precision=prec)
                    vpr = [s[task.primary_metric] for s in task.score(got.x, ev)]
                    k, n = int(sum(vpr)), len(vpr)
                    lo, hi = wilson(k, n)
                    x = torch.where(ev.cond[:256], ev.x0[:256], torch.full_like(ev.x0[:256], model.spec.mask_id))
                    rms = hidden_rms(model, x, L_s)
                    print(f"{name} map={mname} T={a.T} L_s={L_s} VPR {100 * k / n:.1f} "
                          f"[{100 * lo:.1f}, {100 * hi:.1f}] rms(h_l) {' '.join(f'{r:.2f}' for r in rms)}",
                          flush=True)
    finally:
        rmdm.loop_position = original
    return 0


if __name__ == "__main__":
    sys.exit(main())
