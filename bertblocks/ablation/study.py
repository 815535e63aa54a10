"""The study file: a base config, what to vary, what to measure, and (optionally) how to train.

A study is read from YAML (``yaml.safe_load``), validated by pydantic models that forbid unknown keys, and
expanded into *variants*: the grid product of ``vary:`` and/or the named ``variants:``. Every variant's
config is validated up front, through :func:`bertblocks.load_config`, so that a bad key or value is
reported (with its dotted path inside the study) before anything runs or is written.

Example::

    base: bert-tiny
    vary:
      position.name: [absolute, relative_key, relative_key_query]
    measure: {batch: 8, seq_len: 128}
    train: {task: mlm, steps: 50, seeds: [0, 1]}
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, model_validator

from bertblocks.config import BertConfig, ConfigError, ConfigIssue, issues_from_validation_error
from bertblocks.config.limits import MAX_STUDY_RUNS_ENV, max_study_runs
from bertblocks.config_files import apply_overrides, load_config
from bertblocks.readers import ReadError, parse_json, read_yaml
from bertblocks.registry import RegistryError

from ..errors import InputError, MissingFileError, did_you_mean

Metric = Literal["params", "flops", "latency", "memory"]
ALL_METRICS: tuple[Metric, ...] = ("params", "flops", "latency", "memory")


class StudyError(ConfigError):
    """A study that cannot run; ``issues`` lists every problem with its dotted path inside the study file."""

    def __init__(self, issues: Iterable[ConfigIssue], source: str | None = None) -> None:
        super().__init__(issues, source)
        self.args = (str(self.args[0]).replace("invalid config", "cannot run the study", 1),)

    @classmethod
    def single(cls, loc: str, msg: str, study: Study | None = None) -> StudyError:
        """One problem at ``loc`` of ``study``'s file."""
        source = str(study.source) if study is not None and study.source is not None else None
        return cls([ConfigIssue(loc, msg)], source)


# ------------------------------------------------------------------------------------------------ schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeasureSpec(_Strict):
    """Cost measurements, taken on the backbone (no head) at one input shape."""

    batch: PositiveInt = Field(8, description="sequences per forward pass")
    seq_len: PositiveInt = Field(128, description="tokens per sequence")
    metrics: list[Metric] = Field(default_factory=lambda: list(ALL_METRICS), description="which costs to measure")
    repeats: PositiveInt = Field(10, description="timed forward passes; the median is reported")
    warmup: NonNegativeInt = Field(2, description="untimed forward passes first")


class TrainSpec(_Strict):
    """A short training run per variant and seed, for a quality number."""

    task: Literal["mlm", "classification"] = Field("mlm", description="masked-LM pre-training or classification")
    steps: PositiveInt = Field(100, description="optimizer steps")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate (constant)")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    batch_size: PositiveInt = Field(16, description="sequences per step (global, over all DDP ranks)")
    seq_len: PositiveInt = Field(64, description="tokens per training sequence")
    seeds: list[int] = Field(
        default_factory=lambda: [0, 1, 2],
        min_length=1,
        description="one run per seed; intervals need two, and with fewer than three they are unreliable",
    )
    eval_batches: PositiveInt | None = Field(
        None,
        description="held-out batches of batch_size rows for the eval loss; default: the whole held-out set",
    )
    mask_prob: float = Field(0.15, gt=0, lt=1, description="share of tokens masked (mlm)")
    num_labels: PositiveInt = Field(2, description="classes (classification)")
    lr_grid: list[float] | None = Field(
        None,
        min_length=1,
        description="learning rates each variant and seed chooses from, on a validation split of the training "
        "rows (never the eval set); default: lr for every variant",
    )
    budget: Literal["steps", "tokens", "flops", "seconds"] = Field(
        "steps",
        description="what every variant gets the same amount of: optimizer steps, real training tokens, "
        "training FLOPs (3 × the analytic forward FLOPs per token × tokens) or wall-clock seconds",
    )
    budget_value: float | None = Field(
        None,
        gt=0,
        description="the amount (tokens, FLOPs or seconds); default for tokens and flops: what the baseline "
        "spends in `steps` full batches; required for seconds",
    )

    @model_validator(mode="after")
    def _unique_seeds(self) -> TrainSpec:
        if len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"seeds must be distinct; got {self.seeds}")
        if self.lr_grid is not None and any(not (lr > 0 and math.isfinite(lr)) for lr in self.lr_grid):
            raise InputError(f"lr_grid: every rate must be a positive number; got {self.lr_grid}")
        if self.lr_grid is not None and len(set(self.lr_grid)) != len(self.lr_grid):
            raise InputError(f"lr_grid: a rate is listed twice in {self.lr_grid}")
        if self.budget == "seconds" and self.budget_value is None:
            raise InputError("budget: seconds needs budget_value (the seconds every variant trains for)")
        if self.budget == "steps" and self.budget_value is not None:
            raise InputError("budget_value is read with budget: tokens, flops or seconds; with steps, set steps")
        return self


class CorpusSpec(_Strict):
    """Training text: the built-in generated corpus, or a file (one sentence per line; for classification
    ``LABEL<TAB>TEXT`` per line)."""

    kind: Literal["generated", "file"] = "generated"
    path: str | None = Field(None, description="text file (kind: file), relative to the study file")
    sentences: PositiveInt = Field(2000, description="sentences to generate (kind: generated)")
    seed: int = Field(0, description="generator seed; the corpus is a pure function of it")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="share of sentences held out for evaluation")

    @model_validator(mode="after")
    def _path(self) -> CorpusSpec:
        if self.kind == "file" and not self.path:
            raise InputError("kind: file needs a path")
        if self.kind == "generated" and self.path:
            raise InputError("path is only read with kind: file")
        return self


class TokenizerSpec(_Strict):
    """WordPiece tokenizer trained on the corpus (with ``tokenizers``), or an existing ``tokenizer.json``."""

    vocab_size: PositiveInt = Field(1000, description="largest vocabulary to train")
    trainer: Literal["frequency", "wordpiece"] = Field(
        "frequency",
        description="frequency: whole words by count over a character fallback (reproducible); wordpiece: "
        "the tokenizers WordPiece trainer (sub-words; ties broken in hash order, not reproducible)",
    )
    lowercase: bool = True
    path: str | None = Field(None, description="use this tokenizer.json instead of training one")


DownstreamKind = Literal["classification", "pair-classification", "similarity-regression"]
DownstreamMetric = Literal["accuracy", "f1", "spearman", "pearson"]
#: the metrics each kind of downstream task can report, and those reported when ``metrics`` is left out
DOWNSTREAM_METRICS: dict[str, tuple[DownstreamMetric, ...]] = {
    "classification": ("accuracy", "f1"),
    "pair-classification": ("accuracy", "f1"),
    "similarity-regression": ("spearman", "pearson"),
}
DEFAULT_DOWNSTREAM_METRICS: dict[str, tuple[DownstreamMetric, ...]] = {
    "classification": ("accuracy", "f1"),
    "pair-classification": ("accuracy", "f1"),
    "similarity-regression": ("spearman",),
}
#: the tasks shipped with the package (``source: embedded:NAME``) and their kinds
EMBEDDED_TASKS: dict[str, DownstreamKind] = {
    "number": "classification",
    "agreement": "classification",
    "similarity": "similarity-regression",
    "paraphrase": "pair-classification",
}
DOWNSTREAM_FILE_SUFFIXES = (".csv", ".tsv", ".jsonl")


class ColumnsSpec(_Strict):
    """Which columns (CSV/TSV header names, JSONL keys, dataset features) hold the text and the label."""

    text: str | None = Field(None, description="the (first) text; default: sentence, or sentence1 for pairs")
    text_pair: str | None = Field(None, description="the second text of a pair; default: sentence2 (pair kinds)")
    label: str = Field("label", description="the class (an integer or a name) or the similarity score")


class DownstreamTaskSpec(_Strict):
    """A task every pre-trained run is fine-tuned and evaluated on (see docs/how-to/ablation-studies.md)."""

    name: str | None = Field(None, description="column title; default: the embedded name, file stem or dataset")
    kind: DownstreamKind | None = Field(None, description="required unless the source is embedded")
    source: str = Field(
        description="embedded:NAME, a .csv/.tsv/.jsonl file (relative to the study), or hf:DATASET[/CONFIG]"
    )
    eval_source: str | None = Field(
        None, description="held-out file (or, for hf:, the split); default: hold out eval_fraction of source"
    )
    split: str = Field("train", description="the training split (hf: sources)")
    columns: ColumnsSpec = Field(default_factory=ColumnsSpec)
    num_labels: PositiveInt | None = Field(None, description="classes; default: from the labels")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="share held out when there is no eval_source")
    train_examples: PositiveInt | None = Field(
        None, description="training examples (embedded: generated, default 1000; else the first N; default all)"
    )
    eval_examples: PositiveInt | None = Field(
        None, description="eval examples (embedded: generated, default 400; else the first N; default all)"
    )
    steps: PositiveInt = Field(60, description="fine-tuning optimizer steps")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate (constant)")
    lr_grid: list[float] | None = Field(
        None,
        min_length=1,
        description="rates each fine-tuning chooses from by the first metric on a validation split of the "
        "training examples (never the eval examples); default: lr",
    )
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    batch_size: PositiveInt = Field(16, description="examples per step")
    seq_len: PositiveInt | None = Field(None, description="tokens per example (truncated); default: train.seq_len")
    metrics: list[DownstreamMetric] | None = Field(
        None, min_length=1, description="accuracy, f1 (macro) / spearman, pearson; default by kind"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DownstreamTaskSpec:
        prefix, _, rest = self.source.partition(":")
        if prefix == "embedded" and rest:
            if rest not in EMBEDDED_TASKS:
                raise InputError(
                    f"source: no embedded task {rest!r}; there are: {', '.join(EMBEDDED_TASKS)}"
                    + did_you_mean(rest, EMBEDDED_TASKS)
                )
            if self.kind is not None and self.kind != EMBEDDED_TASKS[rest]:
                raise InputError(f"kind: the embedded task {rest!r} is {EMBEDDED_TASKS[rest]}, not {self.kind}")
            self.kind = EMBEDDED_TASKS[rest]
            if self.eval_source is not None:
                raise InputError("eval_source: an embedded task generates its own eval examples")
        elif prefix == "hf":
            if not rest.strip("/"):
                raise InputError("source: hf: needs a dataset name, e.g. hf:glue/sst2")
        elif not self.source.lower().endswith(DOWNSTREAM_FILE_SUFFIXES):
            raise InputError(
                f"source: {self.source!r} is neither embedded:NAME, hf:DATASET[/CONFIG] nor a file ending in "
                + ", ".join(DOWNSTREAM_FILE_SUFFIXES)
            )
        elif self.eval_source is not None and not self.eval_source.lower().endswith(DOWNSTREAM_FILE_SUFFIXES):
            raise InputError(
                f"eval_source: {self.eval_source!r} is not a file ending in {', '.join(DOWNSTREAM_FILE_SUFFIXES)}"
            )
        if self.kind is None:
            raise InputError(
                f"kind: required for source {self.source!r}; choose one of {', '.join(DOWNSTREAM_METRICS)}"
            )
        allowed = DOWNSTREAM_METRICS[self.kind]
        wrong = [m for m in self.metrics or () if m not in allowed]
        if wrong:
            raise InputError(
                f"metrics: {', '.join(wrong)} cannot be computed for {self.kind}; it reports {', '.join(allowed)}"
            )
        if self.metrics is not None and len(set(self.metrics)) != len(self.metrics):
            raise InputError(f"metrics: listed twice in {self.metrics}")
        if self.lr_grid is not None and (
            len(set(self.lr_grid)) != len(self.lr_grid)
            or any(not (lr > 0 and math.isfinite(lr)) for lr in self.lr_grid)
        ):
            raise InputError(f"lr_grid: needs distinct positive rates; got {self.lr_grid}")
        if self.kind == "similarity-regression" and self.num_labels is not None:
            raise InputError("num_labels: a similarity-regression task has one output (the score)")
        return self

    @property
    def title(self) -> str:
        """The task's name in the table: ``name``, else from the source."""
        if self.name:
            return self.name
        prefix, _, rest = self.source.partition(":")
        if prefix in ("embedded", "hf"):
            return rest.strip("/").replace("/", "-")
        return Path(self.source).stem

    @property
    def reported(self) -> list[str]:
        """The metrics reported: ``metrics``, else the kind's defaults."""
        assert self.kind is not None
        return list(self.metrics or DEFAULT_DOWNSTREAM_METRICS[self.kind])

    @property
    def pair(self) -> bool:
        """Whether examples are text pairs."""
        return self.kind != "classification"


class StudySpec(_Strict):
    """The whole study file."""

    name: str | None = Field(None, description="title for the table and plot; the file name when omitted")
    base: str = Field(description="a preset name or a config file (relative to the study file)")
    overrides: dict[str, Any] = Field(default_factory=dict, description="dotted overrides for every variant")
    vary: dict[str, list[Any]] = Field(default_factory=dict, description="dotted key → values (grid product)")
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict, description="name → dotted overrides")
    measure: MeasureSpec = Field(default_factory=MeasureSpec)
    train: TrainSpec | None = None
    corpus: CorpusSpec = Field(default_factory=CorpusSpec)
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    threads: PositiveInt = Field(1, description="torch threads per run (equal everywhere: identical numbers)")
    baseline: str | None = Field(
        None, description="the variant the others are compared with (paired differences); default: the first"
    )
    downstream: list[DownstreamTaskSpec] = Field(
        default_factory=list, description="tasks each pre-trained run is fine-tuned and evaluated on"
    )
    from_scratch: bool = Field(
        True,
        description="with downstream tasks, also fine-tune the baseline's architecture from random weights (a "
        "control row: what pre-training adds)",
    )
    comparisons: Literal["baseline", "all-pairs"] = Field(
        "baseline",
        description="which paired differences the report decides on: each variant against the baseline, or "
        "also every pair of the other variants",
    )
    adjust: Literal["holm", "bh", "none"] = Field(
        "holm",
        description="how the decisions (≈ or resolved) are adjusted over every Δ of the report: holm "
        "(Holm–Bonferroni, family-wise error), bh (Benjamini–Hochberg, false discovery rate), none",
    )


# ------------------------------------------------------------------------------------------- the result
@dataclass(frozen=True)
class Variant:
    """One point of the study: a name, the overrides that make it, and its validated config."""

    name: str
    overrides: dict[str, Any]
    config: BertConfig

    @property
    def slug(self) -> str:
        """File-name-safe name, unique through a short hash of the exact name."""
        text = re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.name).strip("_")[:60]
        return f"{text}-{hashlib.sha1(self.name.encode()).hexdigest()[:6]}"


@dataclass
class Study:
    """A loaded study: the spec, where it came from, and its expanded variants."""

    spec: StudySpec
    source: Path | None
    base_config: BertConfig
    variants: list[Variant] = field(default_factory=list)

    @property
    def title(self) -> str:
        return self.spec.name or (self.source.stem if self.source else "study")

    @property
    def baseline(self) -> str:
        """The variant the others are compared with: ``baseline:``, or the first variant."""
        return self.spec.baseline or self.variants[0].name

    @property
    def seeds(self) -> list[int]:
        return list(self.spec.train.seeds) if self.spec.train else [0]

    def as_written(self) -> dict[str, Any]:
        """The spec as a dict whose file paths (base, corpus, tokenizer) hold wherever the dict is saved."""
        data = self.spec.model_dump(mode="json")
        base = base_file(self.spec.base, self.source)
        if base is not None:
            data["base"] = str(base.resolve())
        for section in ("corpus", "tokenizer"):
            if data[section].get("path"):
                data[section]["path"] = str(self.resolve(data[section]["path"]).resolve())
        for task in data.get("downstream") or []:  # local task files, as the corpus file
            for key in ("source", "eval_source"):
                if task.get(key) and str(task[key]).lower().endswith(DOWNSTREAM_FILE_SUFFIXES):
                    task[key] = str(self.resolve(task[key]).resolve())
        return data

    def resolve(self, relative: str) -> Path:
        """A path written in the study file, taken relative to the study file's folder."""
        path = Path(relative)
        if path.is_absolute() or self.source is None:
            return path
        return self.source.parent / path


def fingerprint(data: Any) -> str:
    """A stable hash of JSON-able data (what decides whether a finished run can be reused)."""
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ loading
def load_study(
    source: str | Path | Mapping[str, Any],
    overrides: list[str] | None = None,
    *,
    config_overrides: Mapping[str, Any] | None = None,
) -> Study:
    """Read, validate and expand a study.

    Args:
        source: a study YAML file, or the study as a dict.
        overrides: ``["train.steps=10", "measure.batch=2"]``: dotted changes to the *study* (values parsed as
            YAML), as ``--set`` gives them on the command line.
        config_overrides: dotted config changes applied to every variant after the study's own (the runner
            uses it to set ``vocab_size`` to the trained tokenizer's).

    Raises:
        FileNotFoundError: the study file does not exist.
        StudyError: every problem found, each with its dotted path in the study.
    """
    where: str | None = None
    path: Path | None = None
    if isinstance(source, Mapping):
        raw: Any = parse_json(json.dumps(dict(source), default=str), "the study")  # a deep copy we may modify
    else:
        path = Path(source)
        if not path.is_file():
            raise MissingFileError(f"study file not found: {path}")
        where = str(path)
        try:
            raw = read_yaml(path) or {}  # bounded: size, UTF-8, nesting, alias bombs refused
        except ReadError as e:
            raise StudyError([ConfigIssue(e.location, e.problem)], where) from None
    if not isinstance(raw, dict):
        raise StudyError([ConfigIssue("", f"expected a mapping at the top, got {type(raw).__name__}")], where)
    for index, text in enumerate(overrides or []):
        try:
            raw = apply_overrides(raw, [text])
        except ConfigError as e:
            raise StudyError([_from_set(issue, index, text) for issue in e.issues], where) from None
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as e:
        issues = issues_from_validation_error(e, model=StudySpec)
        raise StudyError([_blame_set(issue, overrides or []) for issue in issues], where) from None

    if not spec.vary and not spec.variants:
        raise StudyError(
            [
                ConfigIssue(
                    "",
                    "the study has no variants: give `vary:` (dotted key: [values, ...]) and/or "
                    "`variants:` (name: {dotted key: value})",
                )
            ],
            where,
        )
    issues = [ConfigIssue(f"vary.{key}", "needs at least one value") for key, values in spec.vary.items() if not values]
    issues += _downstream_issues(spec)
    if issues:
        raise StudyError(issues, where)

    study = Study(spec=spec, source=path, base_config=_load_base(spec, path, where))
    study.variants = expand_variants(study, config_overrides)
    names = [v.name for v in study.variants]
    if spec.baseline is not None and spec.baseline not in names:
        raise StudyError(
            [
                ConfigIssue(
                    "baseline",
                    f"no variant {spec.baseline!r}; the study has: {', '.join(names)}"
                    + did_you_mean(spec.baseline, names),
                )
            ],
            where,
        )
    return study


def _downstream_issues(spec: StudySpec) -> list[ConfigIssue]:
    """What makes ``downstream:`` impossible: no masked-LM pre-training to fine-tune, or two tasks of one name."""
    if not spec.downstream:
        return []
    if spec.train is None or spec.train.task != "mlm":
        return [
            ConfigIssue(
                "downstream",
                "fine-tunes the weights of masked-LM pre-training: it needs `train:` with task: mlm",
            )
        ]
    reserved = [
        ConfigIssue(f"variants.{name}", "'from-scratch' names the downstream control row; choose another name")
        for name in spec.variants
        if name == "from-scratch"
    ]
    if reserved:
        return reserved
    titles = [task.title for task in spec.downstream]
    return [
        ConfigIssue(f"downstream.{i}.name", f"{title!r} names two tasks; give each a distinct name")
        for i, title in enumerate(titles)
        if titles.index(title) != i
    ]


def _from_set(issue: ConfigIssue, index: int, text: str) -> ConfigIssue:
    """``issue`` said of the ``index``-th ``--set`` (counting from 1, as they were given)."""
    return ConfigIssue(issue.loc, f"{issue.msg} (from --set #{index + 1} {text!r})")


def _blame_set(issue: ConfigIssue, overrides: list[str]) -> ConfigIssue:
    """``issue`` with the ``--set`` that wrote its location named, when one did (the last one wins)."""
    for index in reversed(range(len(overrides))):
        key = overrides[index].partition("=")[0].strip()
        if key and (issue.loc == key or issue.loc.startswith(key + ".") or key.startswith(issue.loc + ".")):
            return _from_set(issue, index, overrides[index])
    return issue


def base_file(base: str, study_file: Path | None) -> Path | None:
    """The config file ``base`` names: relative to the study file first, then to the working directory."""
    candidate = Path(base)
    if study_file is not None and not candidate.is_absolute() and (study_file.parent / candidate).exists():
        return study_file.parent / candidate
    return candidate if candidate.exists() else None


def _load_base(spec: StudySpec, path: Path | None, where: str | None) -> BertConfig:
    found = base_file(spec.base, path)
    source: str | Path = found if found is not None else spec.base
    try:
        return load_config(source)
    except FileNotFoundError:
        raise StudyError(
            [ConfigIssue("base", f"{spec.base!r} is neither a config file (relative to the study) nor a preset")],
            where,
        ) from None
    except RegistryError as e:  # an unknown preset name: the message lists the presets and the closest
        raise StudyError(
            [ConfigIssue("base", f"no config file {spec.base!r} next to the study, and {e}")], where
        ) from None
    except ConfigError as e:
        raise StudyError([ConfigIssue(f"base ({spec.base})", str(i)) for i in e.issues], where) from None


def expand_variants(study: Study, config_overrides: Mapping[str, Any] | None = None) -> list[Variant]:
    """The study's variants with validated configs; ``config_overrides`` applies to each after the study's.

    Raises:
        StudyError: every variant that does not validate, located in the study file; also shapes that
            exceed a variant's ``max_position_embeddings``.
    """
    spec = study.spec
    extra = dict(config_overrides or {})
    where = str(study.source) if study.source else None
    grid_keys = list(spec.vary)
    _check_run_count(study)  # before the grid is spelt out: ten keys of ten values are 10^10 variants
    grid = [dict(zip(grid_keys, values, strict=True)) for values in itertools.product(*spec.vary.values())]
    short = _short_names(grid_keys)
    named: list[tuple[str, str, dict[str, Any]]] = []  # (variant name, study location, overrides)
    for point in grid if grid_keys else [{}]:
        label = ",".join(f"{short[k]}={_show(v)}" for k, v in point.items())
        for variant_name, changes in spec.variants.items() or [("", {})]:
            name = "/".join(part for part in (variant_name, label) if part)
            loc = f"variants.{variant_name}" if variant_name and not label else (f"vary ({name})" if label else "")
            named.append((name, loc, {**changes, **point}))

    base = study.base_config.model_dump()
    base_paths = _dotted_paths(base)
    issues: list[ConfigIssue] = []
    variants: list[Variant] = []
    for name, loc, changes in named:
        data = parse_json(json.dumps(base), "the base config")  # a deep copy, as JSON holds it
        try:
            data = apply_overrides(data, {**spec.overrides, **changes, **extra})
            config = load_config(data)
        except ConfigError as e:
            issues.extend(_locate(e.issues, name, loc, changes, spec, base_paths))
            continue
        longest = max(spec.measure.seq_len, spec.train.seq_len if spec.train else 0)
        if longest > config.max_position_embeddings:
            which = "measure.seq_len" if spec.measure.seq_len == longest else "train.seq_len"
            issues.append(
                ConfigIssue(
                    which,
                    f"{longest} tokens exceed max_position_embeddings={config.max_position_embeddings} of "
                    f"variant {name!r}",
                )
            )
            continue
        variants.append(Variant(name=name, overrides=changes, config=config))
    if issues:
        raise StudyError(_unique(issues), where)
    return variants


def _check_run_count(study: Study) -> None:
    """Refuse a study of more runs (variants × seeds) than the limit, before any variant is made."""
    spec = study.spec
    variants = math.prod(len(values) for values in spec.vary.values()) * max(1, len(spec.variants))
    runs = variants * len(study.seeds)
    limit = max_study_runs()
    if limit is not None and runs > limit:
        raise StudyError.single(
            "vary" if spec.vary else "variants",
            f"the study would make {variants:,} variants and {runs:,} runs, above the limit of {limit:,} runs; "
            f"if you mean it, raise the limit with {MAX_STUDY_RUNS_ENV}={runs}",
            study,
        )


def _locate(
    issues: list[ConfigIssue],
    name: str,
    loc: str,
    changes: dict[str, Any],
    spec: StudySpec,
    base_paths: list[str],
) -> list[ConfigIssue]:
    """Say where in the *study* a config problem comes from: which varied key, which variant."""
    out = []
    for issue in issues:
        key = _owning_key(issue.loc, [*changes, *spec.overrides])
        if key is not None and "unknown field" in issue.msg and issue.loc.startswith(f"{key}."):
            # the key exists; a field inside the value written for it does not (e.g. `options:` under a
            # component, whose options are written beside its name)
            msg = f"variant {name!r}: {issue.loc!r} is not a key of the config: {issue.msg}"
            if issue.loc.rsplit(".", 1)[-1] == "options":
                msg += (
                    f"; a component's options are written beside its name, not under `options:`, e.g. "
                    f"{key}: {{name: ..., OPTION: VALUE}} or {key}.OPTION: VALUE"
                )
            out.append(ConfigIssue(_study_loc(key, name, changes, spec), msg))
        elif key is not None and "unknown field" in issue.msg:
            msg = f"{key!r} is not a key of the config" + did_you_mean(key, base_paths)
            where = _study_loc(key, name, changes, spec)
            out.append(ConfigIssue(where, msg))
        elif key is not None:
            out.append(ConfigIssue(_study_loc(key, name, changes, spec), f"variant {name!r}: {issue}"))
        else:
            out.append(ConfigIssue(loc or "base", f"variant {name!r}: {issue}"))
    return out


def _owning_key(loc: str, keys: list[str]) -> str | None:
    """The dotted override key that the problem at config location ``loc`` comes from, if any."""
    best = None
    for key in keys:
        related = loc == key or loc.startswith(f"{key}.") or key.startswith(f"{loc}.")
        if related and (best is None or len(key) > len(best)):
            best = key
    return best


def _study_loc(key: str, name: str, changes: dict[str, Any], spec: StudySpec) -> str:
    if key in spec.vary:
        return f"vary.{key}"
    variant = name.split("/", 1)[0]
    if key in spec.variants.get(variant, {}):
        return f"variants.{variant}.{key}"
    return f"overrides.{key}"


def _dotted_paths(data: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.append(path)
            out.extend(_dotted_paths(value, path))
    return out


def _short_names(keys: list[str]) -> dict[str, str]:
    """``position.name`` → ``position``, ``encoder.attention.backend`` → ``backend``, unless ambiguous."""

    def short(key: str) -> str:
        parts = key.split(".")
        return parts[-2] if parts[-1] == "name" and len(parts) > 1 else parts[-1]

    shorts = [short(k) for k in keys]
    return {k: (s if shorts.count(s) == 1 else k) for k, s in zip(keys, shorts, strict=True)}


def _show(value: Any) -> str:
    if isinstance(value, str | int | float | bool) or value is None:
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _unique(issues: list[ConfigIssue]) -> list[ConfigIssue]:
    seen: set[str] = set()
    out = []
    for issue in issues:
        if str(issue) not in seen:
            seen.add(str(issue))
            out.append(issue)
    return out
