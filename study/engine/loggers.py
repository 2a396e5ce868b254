"""`--log mlflow[=URI]`, `--log wandb`, `--log tensorboard` on `study run` and `study tune` (what each records,
where, and how to look: docs/guide/running.md). Each is one of Ray Tune's own logger callbacks (MLflowLoggerCallback,
WandbLoggerCallback, TBXLoggerCallback), subclassed below, handed to the Tuner in RunConfig(callbacks=...).

The callbacks run in the driver and only read what trials report to Tune (study/engine/trial.py: `loss` at each
logged step; study.engine.raytune.final_metrics once a run is evaluated) and, once a run is final, the store:
training, its numbers and its random streams are untouched. A missing package or a bad value is a LogError: one
line, exit 2, naming the extra to install.
"""
from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

from study.engine.rows import NLL_KEYS, NLL_SAMPLER
from study.engine.options import TrialOptions
from study.engine.raytune import ray_dir, run_evals, run_of

KINDS = ("mlflow", "wandb", "tensorboard")
PACKAGES = {"mlflow": ("mlflow", "pip install 'rmdm-study[mlflow]'"),
            "wandb": ("wandb", "pip install 'rmdm-study[wandb]'"),
            "tensorboard": ("tensorboardX", "pip install tensorboardX (it comes with ray[tune])")}
LOGGED = ("loss", "final_loss", "objective", "score")  # what MLflow records of a result (and tracker_metrics)
REACH_TIMEOUT_S = 5.0


class LogError(ValueError):
    """A --log value that cannot be used (unknown, package missing, server unreachable): one line."""


@dataclass(frozen=True)
class Sink:
    kind: str  # mlflow, wandb or tensorboard
    uri: str | None = None  # mlflow's tracking URI, when given


def parse(values: list[str] | None, results: str | None = None) -> list[Sink]:
    """The --log values as sinks, each checked: known kind, its package installed, an http(s) MLflow
    server reachable, a tracking URI where the results store (`results`) is remote. Raises LogError (one
    line) otherwise. Cheap: nothing is imported."""
    sinks: dict[str, Sink] = {}
    for value in values or []:
        kind, sep, uri = value.partition("=")
        kind, uri = kind.strip().lower(), uri.strip()
        if kind not in KINDS:
            raise LogError(f"--log {value!r}: unknown; use mlflow[=URI], wandb or tensorboard (repeatable)")
        if sep and kind != "mlflow":
            raise LogError(f"--log {value!r}: {kind} takes no value; only mlflow takes one (mlflow=URI)")
        if sep and not uri:
            raise LogError(f"--log {value!r}: give a tracking URI after '=' (or plain --log mlflow)")
        sink = Sink(kind, uri or None)
        if kind in sinks and sinks[kind] != sink:
            raise LogError(f"--log {kind} given twice with different values")
        sinks[kind] = sink
    for sink in sinks.values():
        pkg, how = PACKAGES[sink.kind]
        if importlib.util.find_spec(pkg) is None:
            raise LogError(f"--log {sink.kind}: the {pkg} package is not installed; install it: {how}")
        if sink.kind == "mlflow":
            uri = sink.uri or os.environ.get("MLFLOW_TRACKING_URI")
            if not uri and results and "://" in results:
                raise LogError(f"--log mlflow: the results store {results} is not local: give a tracking URI "
                               "(--log mlflow=http://HOST:PORT) or set MLFLOW_TRACKING_URI")
            reachable(uri)
    return list(sinks.values())


def reachable(uri: str | None, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """An http(s) tracking URI accepts TCP connections (MLflow itself retries for minutes)."""
    from urllib.parse import urlsplit

    from study.engine.raystart import unreachable

    if not uri or not uri.lower().startswith(("http://", "https://")):
        return
    u = urlsplit(uri)
    try:
        why = unreachable(u.hostname or "", u.port or (443 if u.scheme.lower() == "https" else 80), timeout_s)
    except ValueError as e:  # a port out of range
        why = str(e)
    if why:
        raise LogError(f"--log mlflow={uri}: cannot reach the MLflow tracking server ({why}); is it started "
                       f"(`mlflow server --host 127.0.0.1 --port {u.port or 5000}`)?") from None


def mlflow_uri(sink: Sink, store) -> str:
    """The tracking URI a sink logs to: given, $MLFLOW_TRACKING_URI, or an SQLite file under the study's .ray/
    (a local store: `parse` refused a remote one without a URI)."""
    default = f"sqlite:///{os.path.abspath(ray_dir(store))}/mlflow.db"
    return sink.uri or os.environ.get("MLFLOW_TRACKING_URI") or default


def callbacks(sinks: list[Sink], store, command: str, echo=print) -> list:
    """Ray Tune logger callbacks for `sinks`, for a study's `command` (run or tune); says where each logs.

    Called by every `study run` and `study tune`, --log or not: Ray's newer terminal output prints, even at
    verbose=0, a "Configuration for experiment" box and a TensorBoard hint naming its temporary staging
    directory (/tmp/ray/session_*/...); its legacy output at verbose=0 prints nothing, so the study's own
    lines (and --log tensorboard's, naming the study's directory) are the only ones. RAY_AIR_NEW_OUTPUT=1 set
    by the user brings Ray's back."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # read by Tuner.fit in this process
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # MLflow's "View run" lines, as Ray's
    out = []
    for sink in sinks:
        if sink.kind == "mlflow":
            import logging

            import mlflow  # noqa: F401 -- configures its loggers on import: quieted after

            for name in ("mlflow", "alembic"):  # "Creating initial MLflow database tables..." is no news
                logging.getLogger(name).setLevel(logging.WARNING)
            uri = mlflow_uri(sink, store)
            if uri.startswith("sqlite:///"):  # artifacts beside the database, not in ./mlruns of wherever it runs
                os.makedirs(os.path.dirname(uri.removeprefix("sqlite:///")), exist_ok=True)
                _experiment(uri, store.study, f"{os.path.dirname(uri.removeprefix('sqlite:///'))}/mlartifacts")
            out.append(_mlflow_class()(tracking_uri=uri, experiment_name=store.study,
                                        tags={"study": store.study, "command": f"study {command}"}))
            ui = (f"`mlflow ui --backend-store-uri {uri}`" if not uri.lower().startswith(("http://", "https://"))
                  else f"its web page {uri}")
            echo(f"mlflow: one run per trial in experiment {store.study!r} at {uri} (look: {ui})")
        elif sink.kind == "wandb":
            out.append(_wandb_callback(store, echo))
        else:
            out.append(_tbx_class()())
            echo(f"tensorboard: event files under {ray_dir(store)}/ (look: `tensorboard --logdir {ray_dir(store)}`)")
    return out


# ---- what a logger makes of what a trial reports ------------------------------------------------------
STORE_NAMES = {"task.name": "task", "model.K": "K", "model.L": "L_t", "model.d_model": "d_model",
               "model.n_heads": "heads", "train.lr": "lr", "train.batch_size": "batch", "train.steps": "steps",
               "train.seed": "seed", "train.schedule": "schedule", "train.loss": "loss"}  # store.RUNS' columns


def run_params(config: dict) -> dict:
    """A trial's parameters, flat: the run's resolved config (K, L_t, lr, model.mlp_ratio, ...: the runs table's
    names where it has the field) and its run id."""
    run = run_of(config)
    flat = _flat({k: v for k, v in run.resolved().items() if k != "run_id"})
    return {"run_id": run.run_id, **{STORE_NAMES.get(k, k): v for k, v in flat.items()}}


def run_label(run) -> str:
    """An MLflow run's name: `(1 x 2) d128 seed 0` (shape as the report names it, width, seed)."""
    return f"({run.model.K} x {run.model.L}) d{run.model.d_model} seed {run.train.seed}"


def _experiment(uri: str, name: str, artifacts: str) -> None:
    """Create MLflow experiment `name` at `uri` with its artifacts under `artifacts`, unless it exists."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if client.get_experiment_by_name(name) is None:
        os.makedirs(artifacts, exist_ok=True)
        client.create_experiment(name, artifact_location=f"file://{os.path.abspath(artifacts)}")


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def result_step(result: dict) -> int | None:
    """The training step a result stands at (`train_step` where ASHA's `step` is a scored checkpoint's)."""
    for k in ("train_step", "step"):
        v = result.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return int(v)
    return None


def mlflow_metrics(result: dict) -> dict:
    """What MLflow records of one result: losses and the search's objective. The loss curve is the training
    steps' (a final result repeating the last loss as `loss` adds no point to it). The eval metrics and
    train_seconds come from the store once the run is final (tracker_metrics)."""
    return {k: float(v) for k, v in result.items()
            if k in LOGGED and isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v) and not (k == "loss" and "final_loss" in result)}


def metric_name(metric: str, T: int, L_s: int, sampler: str, split: str, run) -> str:
    """A tracker's name for one evals row, by what a researcher compares across runs: `vpr/T4` at L_s = the
    run's training depth, its first sampler, the test split (a looped and a single-pass model at one T share
    the column); any other point says how it differs: `vpr/T4/Ls1`, `vpr/T4/entropy`, `vpr/T4/val`. The
    continuous quantities (nothing sampled, no T) are the metric and split alone: `elbo`, `ref_nll/val`."""
    if sampler == NLL_SAMPLER:
        return metric + ("" if split == "test" else f"/{split}")
    name = f"{metric}/T{int(T)}"
    if int(L_s) != run.model.L:
        name += f"/Ls{int(L_s)}"
    if sampler != run.eval.sampler[0]:
        name += f"/{sampler}"
    return name + ("" if split == "test" else f"/{split}")


def tracker_metrics(store, run) -> tuple[dict, dict]:
    """(metrics, tags) of a finished run for a tracker, from the store: every metric of the task at every eval
    point with its 95% interval (`<name>`, `<name>/ci_low`, `<name>/ci_high`; names: metric_name) and the
    run's train_seconds; the tags say what the names hold (L_s, sampler, each metric's interval method)."""
    from tasks import TASKS

    from study.engine.rows import clipped

    task = TASKS[run.task.name][1]
    out: dict = {}
    row = store.run_row(run.run_id) or {}
    secs = row.get("train_seconds")
    if isinstance(secs, (int, float)) and math.isfinite(secs):
        out["train_seconds"] = float(secs)
    keys = {pt.key for pt in run.eval_points()} | set(NLL_KEYS.values())  # the sampled points and the ELBO's
    for r in run_evals(store, run.run_id, keys):
        name = metric_name(r.metric, r.T, r.L_s, r.sampler, r.split, run)
        lo, hi = clipped(r.ci_low, r.ci_high, task.metric_of(r.metric))  # a store written before rows were clipped
        for suffix, v in (("", r.value), ("/ci_low", lo), ("/ci_high", hi)):
            if isinstance(v, (int, float)) and math.isfinite(v):
                out[name + suffix] = float(v)
    tags = {"eval.L_s": f"<metric>/T<T> at L_s = L_t = {run.model.L} (the training depth); /Ls<n> at other L_s",
            "eval.sampler": f"{run.eval.sampler[0]} (others named /<sampler>)",
            "eval.primary_metric": task.primary_metric}
    for m in task.metrics:
        tags[f"interval.{m.name}"] = ("95% Wilson interval over the test examples" if m.kind == "rate"
                                      else "95% Student t interval over the test examples")
    return out, tags


def final_metrics(trial, result: dict) -> tuple[dict, dict]:
    """tracker_metrics of a trial's run once `result` says it is evaluated (its final one), else ({}, {})."""
    if result.get("phase") != "final" and "final_loss" not in result:
        return {}, {}
    from store import Store

    run = run_of(trial.config)
    return tracker_metrics(Store(TrialOptions.of_config(trial.config).results, run.study), run)


def _mlflow_class():
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class StudyMLflowLogger(MLflowLoggerCallback):
        """Ray's MLflow callback, one MLflow run per trial named by its model and seed, with the run's resolved
        config as parameters and artifact, the training step as the metrics' step (Ray's: the report's number);
        the study's figures in a run of their own once the sweep ends."""

        def log_trial_start(self, trial) -> None:
            if trial in self._trial_runs:  # a retried trial goes on in its MLflow run
                return
            params = run_params(trial.config)
            tags = {**self.tags, "trial_name": str(trial), "run_id": params["run_id"]}
            run = self.mlflow_util.start_run(tags=tags, run_name=run_label(run_of(trial.config)))
            self._trial_runs[trial] = run.info.run_id
            self.mlflow_util.log_params(run_id=run.info.run_id,
                                        params_to_log={k: _param(v) for k, v in params.items()})
            self._client().log_dict(run.info.run_id, run_of(trial.config).resolved(), "config.json")

        def _client(self):
            from mlflow.tracking import MlflowClient

            return MlflowClient(tracking_uri=self.tracking_uri)

        def on_experiment_end(self, trials, **info) -> None:
            super().on_experiment_end(trials, **info)
            if trials:
                _log_figures(self._client(), self.experiment_name, self.tags,
                             TrialOptions.of_config(trials[0].config).results)

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            if trial not in self._trial_runs:
                self.log_trial_start(trial)
            metrics = mlflow_metrics(result)
            step = result_step(result)
            step = step if step is not None else result.get("training_iteration", 0)
            evals, tags = final_metrics(trial, result)
            metrics.update(evals)
            client = self._client() if tags else None
            for k, v in tags.items():
                client.set_tag(self._trial_runs[trial], k, v)
            if metrics:
                self.mlflow_util.log_metrics(run_id=self._trial_runs[trial], metrics_to_log=metrics, step=step)

    return StudyMLflowLogger


def _log_figures(client, study: str, tags: dict, results: str) -> None:
    """The study's figures (every one its runs can draw, as `study report --figure all` writes them) as the
    artifacts of an MLflow run `study <name>`; a figure the data cannot draw yet is left out, named in a tag."""
    import tempfile

    from analysis.figures import FIGURES
    from analysis.load import MissingData, load_study

    exp = client.get_experiment_by_name(study)
    run = client.create_run(exp.experiment_id, run_name=f"study {study}", tags={**tags, "figures": "all"})
    skipped = []
    with tempfile.TemporaryDirectory(prefix="rmdm-mlflow-") as out:
        try:
            data = load_study(results, study)
            for name, fig in FIGURES.items():
                try:
                    fig(data, out)
                except (MissingData, ValueError) as e:
                    skipped.append(f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 -- a logger only reports: the runs are done and kept
            skipped.append(f"all: {type(e).__name__}: {e}")
        client.log_artifacts(run.info.run_id, out, "figures")
    if skipped:
        client.set_tag(run.info.run_id, "figures.not_drawn", _param("; ".join(skipped)))
    client.set_terminated(run.info.run_id)


def _param(v) -> str:
    s = v if isinstance(v, str) else repr(v) if not isinstance(v, (int, float, bool, type(None))) else str(v)
    return s if len(s) <= 6000 else s[:5997] + "..."  # MLflow's limit on a parameter's value


RAY_KEYS = ("time_this_iter_s", "time_since_restore", "iterations_since_restore", "timesteps_since_restore",
            "done")  # Ray Tune's own bookkeeping in a result that TensorBoard gets (under ray/tune/)


def _tbx_class():
    from ray.tune.logger import TBXLoggerCallback

    class StudyTBXLogger(TBXLoggerCallback):
        """Ray's TensorBoard callback, the training step as TensorBoard's step; the study's metrics as tags of
        their own, `study/<name>` with MLflow's names (loss, final_loss, train_seconds, vpr/T4, ...), apart
        from Ray Tune's bookkeeping (`ray/tune/time_this_iter_s`, ...)."""

        def log_trial_result(self, iteration: int, trial, result: dict) -> None:
            if trial not in self._trial_writer:
                self.log_trial_start(trial)
            step = result_step(result)
            ours = mlflow_metrics(result)
            ours.update(final_metrics(trial, result)[0])
            for k, v in ours.items():
                self._trial_writer[trial].add_scalar(f"study/{k}", v, global_step=step)
            ray_own = {k: result[k] for k in RAY_KEYS if k in result}
            if step is not None:  # Ray takes timesteps_total, or training_iteration when that is 0
                ray_own.update(timesteps_total=step, training_iteration=step)
            else:
                ray_own["training_iteration"] = result.get("training_iteration", 0)
            super().log_trial_result(iteration, trial, ray_own)

    return StudyTBXLogger


def _wandb_callback(store, echo):
    from ray.air.integrations.wandb import WandbLoggerCallback

    kw = {}
    if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
        os.environ["WANDB_MODE"] = "offline"  # Ray's callback then asks for no key
    mode = os.environ.get("WANDB_MODE")
    if mode:
        kw["mode"] = mode  # wandb.init's, in the logging actor (which may not see this process's environment)
    where = ""
    if store.local:
        kw["dir"] = os.path.abspath(f"{ray_dir(store)}/wandb")
        os.makedirs(kw["dir"], exist_ok=True)
        where = f", files under {kw['dir']}/wandb"
    project = os.environ.get("WANDB_PROJECT") or store.study

    class StudyWandbLogger(WandbLoggerCallback):
        """Ray's W&B callback with the run's resolved config as the W&B run's config and its run id as name."""

        def log_trial_start(self, trial) -> None:
            params = run_params(trial.config)
            exclude = [*self._exclude_results, *self.excludes, *([] if self.log_config else ["config"])]
            self._start_logging_actor(trial, exclude, id=trial.trial_id, name=params["run_id"], resume=False,
                                      reinit=True, allow_val_change=True, group=self.group or store.study,
                                      project=self.project, config=params, **self.kwargs)

    echo(f"wandb: project {project!r}, {mode or 'online'}{where}"
         + ("; upload later with `wandb sync`" if mode == "offline" else ""))
    return StudyWandbLogger(project=project, group=store.study, **kw)
