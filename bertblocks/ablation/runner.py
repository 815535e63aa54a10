"""Runs a study: validate everything, then run each variant × seed, writing each run as it finishes.

Order of work, chosen so that a bad study or an unreachable cluster leaves nothing on disk:

1. load and validate the study and every variant's config (:func:`~bertblocks.ablation.study.load_study`);
2. read the corpus and train the tokenizer (in memory), set every variant's ``vocab_size`` to it;
3. connect to Ray when asked (:func:`~bertblocks.ablation.executors.connect_ray`);
4. only now create the output folder, then run what is not already there.

Output folder::

    study.yaml          the study as run (after --set)
    tokenizer.json      the trained tokenizer (reused on resume, so token ids stay the same)
    runs/<variant>__seed<N>.json   one record per finished run, written atomically as it completes
    weights/<run>__<fingerprint>.pt   a run's pre-trained weights (only with ``downstream:`` tasks)
    downstream/<run>__<task>.json    one record per fine-tuning of a run on a downstream task
    results.json, results.csv, results.png   the summaries, rewritten at the end
    results-pareto.png  quality against each cost, the Pareto front marked (studies that train)

A run whose record exists with the same fingerprint is not redone, so an interrupted study resumes where
it stopped; a record whose fingerprint differs is run again and replaced. The fingerprint holds everything
a run's numbers depend on: the variant's config, the seed, the measurement and training settings, the
corpus settings, the tokenizer (a saved one is reused only for the same tokenizer settings and corpus),
the token tensors, the thread count, and the code (:func:`~bertblocks.ablation.provenance.code_version`).

One study at a time per folder: the runner holds a lock on ``.study.lock`` in it (see
:mod:`~bertblocks.ablation.lock`) from before it writes anything until the summaries are written; a
second study into the same folder is refused with :class:`~bertblocks.ablation.lock.StudyLockedError`.

A run whose training diverges (NaN or inf loss) is recorded with ``status: diverged`` and no quality
metrics; the summaries are written for every variant and say which seeds diverged.

With ``downstream:`` tasks (:mod:`bertblocks.ablation.downstream`), the pre-training runs come first, each
keeping its weights; then every finished run is fine-tuned on every task. A fine-tuning whose record exists
with the same fingerprint (the pre-training run's, the task's settings and tensors, the code) is not redone;
a pre-training run is redone only when a fine-tuning still to do needs weights that are not on disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..atomic import write_bytes, write_text
from ..errors import BertBlocksError, InputError
from ..readers import ReadError, read_json
from . import downstream, report
from .comparisons import decide, full_table
from .data import PreparedData, get_tokenizer, load_texts, prepare, tokenizer_key
from .downstream import (
    FROM_SCRATCH,
    DownstreamData,
    DownstreamRunTask,
    finetune_config,
    prepare_downstream,
    spec_metrics,
)
from .executors import Executor, InlineExecutor, LocalExecutor, RayExecutor, connect_ray, describe
from .interrupts import Interrupts, StudyInterruptedError, stopping_notice
from .lock import FolderLock
from .provenance import code_version, data_fingerprint, plugin_versions
from .run import RunTask
from .study import Study, StudyError, expand_variants, fingerprint, load_study
from .training import resolved_train

logger = logging.getLogger("bertblocks")


class StudyRunError(BertBlocksError, RuntimeError):
    """Some runs failed; the others are written. ``failures`` maps run id → error text."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        lines = "\n".join(f"  {run}: {error}" for run, error in failures.items())
        super().__init__(f"{len(failures)} run(s) failed (the others are saved; rerun to retry):\n{lines}")


@dataclass
class StudyResult:
    """What :func:`run_study` did and found."""

    study: Study
    out_dir: Path
    summaries: list[report.VariantSummary]
    records: list[dict[str, Any]]
    executed: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    table: str = ""
    #: the downstream fine-tunings (``<run>__<task>``) done by this call, and those found on disk
    downstream_executed: list[str] = field(default_factory=list)
    downstream_reused: list[str] = field(default_factory=list)
    downstream_records: list[dict[str, Any]] = field(default_factory=list)
    #: the downstream table's control rows (majority / mean, chance, from scratch)
    controls: list[downstream.ControlRow] = field(default_factory=list)


def run_study(
    source: str | Path | Study,
    out_dir: str | Path | None = None,
    *,
    overrides: Sequence[str] = (),
    executor: Literal["local", "ray"] = "local",
    workers: int = 1,
    ray_address: str | None = None,
    progress: bool = True,
    echo: Callable[[str], None] | None = print,
) -> StudyResult:
    """Run (or resume) a study and write its results.

    Args:
        source: a study YAML file, or a loaded :class:`Study`.
        out_dir: output folder; default ``ablation/<study name>`` in the working directory.
        overrides: ``--set``-style dotted changes to the study (``train.steps=10``).
        executor: ``local`` worker processes or ``ray``.
        workers: local worker processes (``local`` only); 0 runs in this process, one run after another.
        ray_address: Ray cluster address (``ray`` only); ``None`` joins a Ray instance this process already
            started, or starts a local one.
        progress: show a progress bar on stderr.
        echo: where the table goes (``None``: nowhere).

    Raises:
        StudyError: an invalid study, a missing corpus file, Ray missing or unreachable (nothing written).
        InputError: ``out_dir`` is a file or below one (nothing written).
        StudyRunError: runs that failed (after the others are written and summarised).
        StudyInterruptedError: a SIGINT (Ctrl-C) or SIGTERM stopped the study; every run that finished is
            recorded (no summaries are written); running the study again resumes it.
    """
    study = source if isinstance(source, Study) else load_study(source, list(overrides))
    if executor not in ("local", "ray"):
        raise StudyError.single("executor", f"unknown executor {executor!r}; choose local or ray", study)
    if executor == "local" and workers < 0:
        raise StudyError.single("workers", f"must be 0 (this process) or more; got {workers}", study)
    out = Path(out_dir) if out_dir is not None else Path("ablation") / study.title
    _check_out(out)

    data, tokenizer_json, texts = None, None, None
    tasks_data: list[DownstreamData] = []
    if study.spec.train is not None:
        texts, labels = load_texts(study)
        tokenizer = get_tokenizer(study, texts, saved=out / "tokenizer.json")
        data = prepare(study, tokenizer, texts, labels)
        _warn_small_eval_set(study, data)
        tokenizer_json = tokenizer.to_str()
        overrides_for_data: dict[str, Any] = {"vocab_size": data.vocab_size, "pad_token_id": data.pad_id}
        if study.spec.train.task == "classification":
            overrides_for_data["num_labels"] = study.spec.train.num_labels
            overrides_for_data["id2label"] = None
            overrides_for_data["label2id"] = None
        study.variants = expand_variants(study, overrides_for_data)
        tasks_data = prepare_downstream(study, tokenizer)  # every task read and checked before anything is written

    started_ray = False
    if executor == "ray":
        started_ray = connect_ray(ray_address, num_cpus=workers if ray_address is None else None)
    stack = ExitStack()
    interrupts = Interrupts(stopping_notice if progress else None)
    try:
        tasks = _tasks(study, data, tokenizer_json)
        for task in tasks:
            task.keep_weights = bool(tasks_data)
        plans = _downstream_plans(tasks, tasks_data)
        scratch = _from_scratch_tasks(study, tasks_data) if study.spec.from_scratch else []
        # one study per folder: a second one is refused before it writes anything (released at exit, or
        # with the process if it is killed)
        stack.enter_context(FolderLock(out))
        runs_dir = out / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        write_text(out / "study.yaml", yaml.safe_dump(study.as_written(), sort_keys=False))
        if tokenizer_json is not None and texts is not None:
            write_text(out / "tokenizer.json", tokenizer_json)
            write_text(out / "tokenizer.key", tokenizer_key(study, texts))

        downstream_dir, weights_dir = out / "downstream", out / "weights"
        if plans:
            downstream_dir.mkdir(exist_ok=True)
            weights_dir.mkdir(exist_ok=True)
        ds_records: dict[str, dict[str, Any]] = {}
        ds_todo: dict[str, list[_Plan]] = {}  # pre-training run id → the fine-tunings still to do
        for plan in plans:
            previous = _read_downstream_record(downstream_dir / f"{plan.run_id}.json")
            if previous is not None and previous["fingerprint"] == plan.fingerprint:
                ds_records[plan.run_id] = previous
            else:
                ds_todo.setdefault(plan.pretrain.run_id, []).append(plan)

        scratch_todo = []  # the from-scratch control's fine-tunings still to do
        for ds_task in scratch:
            previous = _read_downstream_record(downstream_dir / f"{ds_task.run_id}.json")
            if previous is not None and previous["fingerprint"] == ds_task.fingerprint:
                ds_records[ds_task.run_id] = previous
            else:
                scratch_todo.append(ds_task)

        records: dict[str, dict[str, Any]] = {}
        todo: list[RunTask] = []
        for task in tasks:
            previous = _read_record(runs_dir / f"{task.run_id}.json")
            needs_weights = (
                task.run_id in ds_todo
                and previous is not None
                and previous.get("status") == "ok"
                and not _weights_path(weights_dir, task).is_file()
            )
            if previous is not None and previous["fingerprint"] == task.fingerprint and not needs_weights:
                records[task.run_id] = previous
            else:
                todo.append(task)
        result = StudyResult(study, out, [], [], reused=list(records), downstream_reused=list(ds_records))

        failures: dict[str, str] = {}
        # from here a Ctrl-C or SIGTERM stops the runs and keeps the finished ones (bertblocks.ablation.interrupts)
        interrupts.install()
        engine: Executor
        if executor == "ray":
            engine = RayExecutor(study.spec.threads, interrupts)
        else:
            engine = LocalExecutor(workers, interrupts) if workers else InlineExecutor(interrupts)
        # weighed by estimated FLOPs: a pre-training run and a fine-tuning are not the same work
        work = {t.run_id: estimated_work(t) for t in tasks} if progress else {}
        ds_work = (
            {p.run_id: estimated_work(_plan_task(p)) for p in plans} | {t.run_id: estimated_work(t) for t in scratch}
            if progress
            else {}
        )
        bar = _progress(
            len(tasks) + len(plans) + len(scratch),
            len(records) + len(ds_records),
            sum(work.values()) + sum(ds_work.values()),
            sum(work[r] for r in records if r in work) + sum(ds_work[r] for r in ds_records if r in ds_work),
            study.title,
            progress,
        )
        try:
            for task, outcome in engine.run(todo):
                if isinstance(outcome, BaseException) and interrupts.requested:
                    continue  # stopped, not failed: a resume runs it
                if isinstance(outcome, BaseException):
                    failures[task.run_id] = describe(outcome)
                else:
                    weights = outcome.pop("weights", None)
                    if weights is not None:  # before the record: a record on disk means its weights are too
                        _write_weights(weights_dir, task, weights)  # type: ignore[arg-type]
                    write_text(runs_dir / f"{task.run_id}.json", json.dumps(outcome, indent=2) + "\n")
                    records[task.run_id] = outcome
                    result.executed.append(task.run_id)
                bar.update(1, work.get(task.run_id, 0.0))
            engine.close()  # the pre-training pool; the fine-tunings start their own
            fine_tunings = _downstream_tasks(tasks, records, ds_todo, weights_dir, study.spec.threads, bar, ds_work)
            fine_tunings += scratch_todo
            for ds_task, outcome in engine.run(fine_tunings):  # type: ignore[arg-type]
                if isinstance(outcome, BaseException) and interrupts.requested:
                    continue  # stopped, not failed: a resume runs it
                if isinstance(outcome, BaseException):
                    failures[ds_task.run_id] = describe(outcome)
                else:
                    write_text(downstream_dir / f"{ds_task.run_id}.json", json.dumps(outcome, indent=2) + "\n")
                    ds_records[ds_task.run_id] = outcome
                    result.downstream_executed.append(ds_task.run_id)
                bar.update(1, ds_work.get(ds_task.run_id, 0.0))
        finally:
            bar.close()
            engine.close()
            interrupts.settle()
        if interrupts.signum is not None:  # the finished runs are on disk; no summaries of a part of the study
            recorded = len(records) + len(ds_records)
            raise StudyInterruptedError(interrupts.signum, out, recorded, len(tasks) + len(plans))

        ordered = [records[t.run_id] for t in tasks if t.run_id in records]
        result.records = ordered
        result.summaries = report.summarize(
            [(v.name, v.overrides) for v in study.variants], ordered, baseline=study.baseline
        )
        result.downstream_records = [ds_records[p.run_id] for p in plans if p.run_id in ds_records]
        control_runs = [ds_records[t.run_id] for t in scratch if t.run_id in ds_records]
        downstream.attach(
            result.summaries,
            result.downstream_records,
            [(d.name, spec_metrics(d.spec)) for d in tasks_data],
            study.baseline,
        )
        result.controls = downstream.controls(
            [*result.downstream_records, *control_runs],
            [(d.name, spec_metrics(d.spec)) for d in tasks_data],
            study.baseline,
        )
        decide(
            result.summaries,
            ordered,
            result.downstream_records,
            scope=study.spec.comparisons,
            method=study.spec.adjust,
        )
        result.table = full_table(study.title, result.summaries, result.controls)
        report.write_json(
            out / "results.json",
            study.title,
            result.summaries,
            ordered,
            downstream=result.downstream_records,
            comparisons={"scope": study.spec.comparisons, "adjust": study.spec.adjust},
            controls=result.controls,
            control_runs=control_runs,
        )
        report.write_csv(
            out / "results.csv", result.summaries, downstream.csv_columns(result.summaries) if tasks_data else None
        )
        written = [out / "results.csv", out / "results.json"]
        if importlib.util.find_spec("matplotlib") is not None:
            report.write_plot(out / "results.png", study.title, result.summaries)
            written.append(out / "results.png")
            from .pareto import write_pareto_plot  # quality against cost (studies that train)

            if write_pareto_plot(out / "results-pareto.png", study.title, result.summaries, controls=result.controls):
                written.append(out / "results-pareto.png")
    finally:
        stack.close()  # the lock is held until the summaries are written
        if started_ray:
            import ray

            ray.shutdown()
        interrupts.restore()  # after Ray's shutdown: Ray's signal checks may run the handler again for one signal
    if interrupts.signum is not None:  # a stop asked for while the summaries were written: still a stop
        raise StudyInterruptedError(interrupts.signum, out, len(records) + len(ds_records), len(tasks) + len(plans))
    if echo is not None:
        echo(result.table)
        echo(f"results: {', '.join(map(str, written))}")
        if len(written) == 2:
            echo("no plot: matplotlib is not installed (pip install -e '.[ablation]' in the bertblocks checkout)")
    if failures:
        raise StudyRunError(failures)
    return result


def _check_out(out: Path) -> None:
    """Refuse, before any work, an output folder that cannot be one: a file, or below a file."""
    for folder in (out, *out.parents):
        if folder.exists():
            if not folder.is_dir():
                where = "is a file" if folder == out else f"is below {folder}, which is a file"
                raise InputError(f"the output folder {out} {where}; give a folder (--out)")
            return


def _warn_small_eval_set(study: Study, data: PreparedData) -> None:
    """Say, by name, when ``train.eval_batches`` asks for more held-out rows than there are (every row is
    then used; the table repeats the note)."""
    from .training import eval_rows

    assert study.spec.train is not None
    used, asked = eval_rows(data, study.spec.train)
    if asked is not None and asked > used:
        logger.warning("%s", report.small_eval_note(used, asked, study.spec.train.seq_len))


def _tasks(study: Study, data: PreparedData | None, tokenizer_json: str | None) -> list[RunTask]:
    spec = study.spec
    measure = spec.measure.model_dump(mode="json")
    train = resolved_train(study)  # a tokens or flops budget made concrete: part of every run's fingerprint
    shared = {
        "measure": measure,
        "train": {k: v for k, v in (train or {}).items() if k != "seeds"} or None,
        "corpus": spec.corpus.model_dump(mode="json") if train else None,
        "tokenizer": fingerprint(tokenizer_json) if tokenizer_json else None,
        "data": data_fingerprint(data),
        "code": code_version(),
        "threads": spec.threads,
    }
    tasks = []
    for variant in study.variants:
        config = variant.config.model_dump(mode="json")
        plugins = plugin_versions(variant.config)
        for seed in study.seeds:
            tasks.append(
                RunTask(
                    variant=variant.name,
                    seed=seed,
                    config=config,
                    measure=measure,
                    train=train,
                    data=data,
                    threads=spec.threads,
                    fingerprint=fingerprint({**shared, "config": config, "plugins": plugins, "seed": seed}),
                    run_id=f"{variant.slug}__seed{seed}",
                )
            )
    return tasks


@dataclass
class _Plan:
    """A fine-tuning to have: a pre-training run on a downstream task."""

    pretrain: RunTask
    data: DownstreamData
    fingerprint: str
    run_id: str


def _task_slug(data: DownstreamData) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", data.name).strip("_")[:40] or "task"
    return f"{slug}-{hashlib.sha1(data.name.encode()).hexdigest()[:6]}"


def _from_scratch_tasks(study: Study, tasks_data: list[DownstreamData]) -> list[DownstreamRunTask]:
    """The from-scratch control: the baseline's architecture fine-tuned on every task with every seed, from
    its random initialisation (no pre-trained weights), by the same recipe as the variants."""
    variant = next(v for v in study.variants if v.name == study.baseline)
    config = variant.config.model_dump(mode="json")
    out = []
    for data in tasks_data:
        shared = {"task": data.spec, "data": data.digest(), "code": code_version(), "config": config}
        for seed in study.seeds:
            out.append(
                DownstreamRunTask(
                    variant=FROM_SCRATCH,
                    seed=seed,
                    config=finetune_config(config, data),
                    task=data.spec,
                    data=data,
                    weights=None,
                    threads=study.spec.threads,
                    fingerprint=fingerprint(
                        {**shared, "seed": seed, "threads": study.spec.threads, "control": FROM_SCRATCH}
                    ),
                    run_id=f"{FROM_SCRATCH}__seed{seed}__{_task_slug(data)}",
                    pretrain_run="",
                )
            )
    return out


def _plan_task(plan: _Plan) -> DownstreamRunTask:
    """A plan as the task it becomes, without its weights (for :func:`estimated_work`)."""
    return DownstreamRunTask(
        variant=plan.pretrain.variant,
        seed=plan.pretrain.seed,
        config=finetune_config(plan.pretrain.config, plan.data),
        task=plan.data.spec,
        data=None,
        weights=None,
        threads=plan.pretrain.threads,
        fingerprint=plan.fingerprint,
        run_id=plan.run_id,
        pretrain_run=plan.pretrain.run_id,
    )


def _downstream_plans(tasks: list[RunTask], tasks_data: list[DownstreamData]) -> list[_Plan]:
    """Every pre-training run × downstream task, with the fingerprint its record must have to be reused."""
    plans = []
    for data in tasks_data:
        shared = {"task": data.spec, "data": data.digest(), "code": code_version()}
        slug = _task_slug(data)
        for task in tasks:
            plans.append(
                _Plan(
                    pretrain=task,
                    data=data,
                    fingerprint=fingerprint({**shared, "pretrain": task.fingerprint}),
                    run_id=f"{task.run_id}__{slug}",
                )
            )
    return plans


def _weights_path(folder: Path, task: RunTask) -> Path:
    # the fingerprint in the name: weights of an earlier, different run are never taken for this one's
    return folder / f"{task.run_id}__{task.fingerprint}.pt"


def _write_weights(folder: Path, task: RunTask, weights: bytes) -> None:
    path = _weights_path(folder, task)
    write_bytes(path, weights)  # atomically: a resumed study never loads half the weights
    for stale in folder.glob(f"{task.run_id}__*.pt"):  # an earlier fingerprint's weights
        if stale != path:
            stale.unlink(missing_ok=True)


def _downstream_tasks(
    tasks: list[RunTask],
    records: dict[str, dict[str, Any]],
    todo: dict[str, list[_Plan]],
    weights_dir: Path,
    threads: int,
    bar: Any,
    work: dict[str, float],
) -> list[DownstreamRunTask]:
    """The fine-tunings still to do, of the runs that pre-trained (one that failed or diverged has none:
    its fine-tunings are counted done on the progress bar and left out of the summaries)."""
    out = []
    for task in tasks:
        plans = todo.get(task.run_id, [])
        record = records.get(task.run_id)
        path = _weights_path(weights_dir, task)
        if not plans:
            continue
        if record is None or record.get("status") != "ok" or not path.is_file():
            bar.update(len(plans), sum(work.get(plan.run_id, 0.0) for plan in plans))
            continue
        weights = path.read_bytes()
        for plan in plans:
            out.append(
                DownstreamRunTask(
                    variant=task.variant,
                    seed=task.seed,
                    config=finetune_config(task.config, plan.data),
                    task=plan.data.spec,
                    data=plan.data,
                    weights=weights,
                    threads=threads,
                    fingerprint=plan.fingerprint,
                    run_id=plan.run_id,
                    pretrain_run=task.run_id,
                )
            )
    return out


def _read_downstream_record(path: Path) -> dict[str, Any] | None:
    """A fine-tuning's record (as :func:`_read_record`), or ``None`` when it must be done (again)."""
    record = _read_record(path)
    if record is None:
        return None
    if not isinstance(record.get("task"), str):
        return _unreadable(path, "is not a downstream record (no 'task')")
    if record.get("status") == "ok":
        kept = record.get("predictions")
        lists = [kept.get("pred"), kept.get("gold")] if isinstance(kept, dict) else [None]
        if not all(
            isinstance(v, list) and len(v) == len(lists[0]) and all(isinstance(x, int | float) for x in v)
            for v in lists
        ):
            return _unreadable(path, "holds predictions that are not two equally long lists of numbers")
    return record


def _read_record(path: Path) -> dict[str, Any] | None:
    """The run record at ``path``, or ``None`` when the run must be done (again).

    A record that cannot be what :func:`~bertblocks.ablation.run.execute` wrote (not UTF-8, not JSON, not
    an object, or without its fields) is named in a warning and run again: it is replaced when the run
    finishes, so the summaries never read it.
    """
    try:
        record = read_json(path)
    except FileNotFoundError:
        return None
    except ReadError as e:  # cut short by a crash of an older version, or edited by hand
        return _unreadable(path, f"is {e.problem}" if e.problem.startswith("not ") else e.problem)
    if not isinstance(record, dict):
        return _unreadable(path, f"holds a JSON {type(record).__name__}, not a run record (an object)")
    problems = [
        f"{key!r} ({_KINDS[kind]})"
        for key, kind in RECORD_FIELDS.items()
        if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool)
    ]
    if problems:
        return _unreadable(path, f"is not a complete run record (missing or mistyped: {', '.join(problems)})")
    samples = record.get("eval_samples")
    if samples is not None and not _valid_samples(samples):
        return _unreadable(path, "holds eval_samples that are not lists of numbers")
    return record


def _valid_samples(samples: Any) -> bool:
    """Whether a record's ``eval_samples`` are what :func:`~bertblocks.ablation.training.evaluate` writes."""
    if not isinstance(samples, dict) or not isinstance(samples.get("loss"), list):
        return False
    lists = [samples["loss"], *(samples[key] for key in ("correct", "sentence") if key in samples)]
    return all(
        isinstance(values, list)
        and len(values) == len(samples["loss"])
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        for values in lists
    )


#: the fields every run record holds, and their types (what the summaries read)
RECORD_FIELDS: dict[str, type] = {"fingerprint": str, "variant": str, "seed": int, "metrics": dict}
_KINDS = {str: "a string", int: "an integer", dict: "an object"}


def _unreadable(path: Path, reason: str) -> None:
    logger.warning("run record %s %s; running it again (the record is replaced when it finishes)", path, reason)
    return None


class _Bar:
    def update(self, runs: int, work: float) -> None: ...

    def close(self) -> None: ...


class _TextBar(_Bar):
    """Without tqdm: one line per finished run, with the share of the estimated work done."""

    def __init__(self, total: int, done: int, work: float, work_done: float, title: str) -> None:
        self.total, self.done, self.title = total, done, title
        self.work, self.work_done = work, work_done

    def update(self, runs: int, work: float) -> None:
        self.done += runs
        self.work_done += work
        share = self.work_done / self.work if self.work else 1.0
        print(
            f"{self.title}: {self.done}/{self.total} runs ({share:.0%} of the estimated work)",
            file=sys.stderr,
            flush=True,
        )


class _TqdmBar(_Bar):
    """A tqdm bar over the estimated FLOPs, so that its rate and ETA weigh a pre-training run and a short
    fine-tuning by what they cost, not as one run each; the runs are counted beside it."""

    def __init__(self, total: int, done: int, work: float, work_done: float, title: str) -> None:
        from tqdm import tqdm

        self.total, self.done = total, done
        self.bar = tqdm(
            total=work,
            initial=work_done,
            desc=title,
            unit="FLOP",
            unit_scale=True,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.bar.set_postfix_str(f"{done}/{total} runs")

    def update(self, runs: int, work: float) -> None:
        self.done += runs
        self.bar.set_postfix_str(f"{self.done}/{self.total} runs", refresh=False)
        self.bar.update(work)

    def close(self) -> None:
        self.bar.close()


def _progress(total: int, done: int, work: float, work_done: float, title: str, enabled: bool) -> _Bar:
    if not enabled:
        return _Bar()
    if importlib.util.find_spec("tqdm") is None:
        return _TextBar(total, done, work, work_done, title)
    return _TqdmBar(total, done, work, work_done, title)


def estimated_work(task: RunTask | DownstreamRunTask) -> float:
    """A run's estimated FLOPs, what the progress bar weighs it by: the training steps' (3 × the analytic
    forward FLOPs per token × tokens; under a token or FLOP budget, the budget; × the rates of an
    ``lr_grid``), or a fine-tuning's, plus the cost measurement's forward passes."""
    from bertblocks.config_files import load_config

    from .flops import analytic_flops_per_token

    config = load_config(task.config)
    if isinstance(task, DownstreamRunTask):
        spec = task.task
        length = int(spec["seq_len"])
        return 3 * analytic_flops_per_token(config, length).per_token * spec["steps"] * spec["batch_size"] * length
    measure = task.measure
    work = (
        analytic_flops_per_token(config, measure["seq_len"]).per_token
        * measure["batch"]
        * measure["seq_len"]
        * (measure["repeats"] + measure["warmup"])
    )
    train = task.train
    if train is not None:
        per_token = 3 * analytic_flops_per_token(config, train["seq_len"]).per_token
        tokens = train["steps"] * train["batch_size"] * train["seq_len"]
        if train.get("budget") == "flops" and train.get("budget_value"):
            trained = float(train["budget_value"])
        elif train.get("budget") == "tokens" and train.get("budget_value"):
            trained = float(train["budget_value"]) * per_token
        else:
            trained = tokens * per_token
        work += trained * len(train.get("lr_grid") or [None])
    return work
