"""Downstream evaluation: fine-tune each pre-trained run on the study's ``downstream:`` tasks, and summarise.

After a run's masked-LM pre-training, its weights are saved beside its record (``weights/``); each
downstream task then builds the variant's sequence-classification model (the head the family gives that
task, as :func:`~bertblocks.ablation.training.task_model` does; one output and an MSE loss for
similarity-regression), loads the pre-trained backbone into it (every weight the two models share by name),
fine-tunes it with the run's seed (head initialisation, batch order, dropout), and predicts the held-out
examples. A run × task is one record (``downstream/<run>__<task>.json``, written atomically), so a killed
study resumes without redoing the fine-tunings that finished, or the pre-training they came from.

Metrics, one value per seed: ``accuracy``, ``f1`` (macro-F1 over the classes present in the gold labels or
the predictions, as scikit-learn's default), ``spearman`` (Pearson's correlation of average ranks, ties
shared) and ``pearson``; a correlation with a constant side (a model that predicts one score) is 0.

Intervals, as the eval loss's (:mod:`bertblocks.ablation.stats`): every run predicts the same eval examples,
so the runs of a variant are a seeds × examples layout. Accuracy is the mean of per-example 0/1 values and
gets the same analytic interval as the eval loss. F1 and the correlations are not means of per-example
values; their eval-sample noise comes from a bootstrap over examples (``RESAMPLES`` resamples with one fixed
generator, the same index sets for every run, so differences stay paired). With per-seed bootstrap variances
``V_s`` and the variance ``V̄`` of the seed-averaged metric over the resamples, the examples' share is
``V̄ − (mean V_s − V̄)/(S − 1)`` (the seed × example interaction taken out, as the residual mean square does
for the eval loss), added to the spread of the per-seed values over ``S``; Welch–Satterthwaite degrees of
freedom, Student's t. Paired differences against the baseline apply the same to ``variant − baseline``
per seed and per resample; ``≈`` marks a difference whose interval contains 0.
"""

from __future__ import annotations

import hashlib
import io
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from ..errors import InputError
from .stats import LEVEL, SHORT_NAMES, Interval, interval, paired_difference, t_quantile
from .study import DownstreamTaskSpec, Study, StudyError
from .tasks import EMBEDDED_SIZES, Example, TaskDataError, embedded_examples, load_hf, read_examples

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from .report import VariantSummary

#: bootstrap resamples of the eval examples, and the seed of the one generator that draws them
RESAMPLES = 1000
BOOTSTRAP_SEED = 20240917
#: the most classes a downstream classification task may have (checked before any training starts)
MAX_LABELS = 1000
#: bytes the bootstrap may hold at once (its resamples are computed in chunks that fit)
BOOTSTRAP_BYTES = 256 * 2**20
#: metric → its short title in the table
TITLES = {"accuracy": "acc", "f1": "F1", "spearman": "ρ", "pearson": "r"}
#: the variant name of the from-scratch control's fine-tuning records (no study variant may take it)
FROM_SCRATCH = "from-scratch"
#: the seed of the generator that draws the chance control's predictions
CHANCE_SEED = 20261127


# ------------------------------------------------------------------------------------------------ data
@dataclass
class DownstreamData:
    """One task's token tensors, identical for every run.

    Attributes:
        name: the task's title (its column in the table, its record files).
        index: its position in ``downstream:`` (for messages).
        spec: the task's :class:`~bertblocks.study.DownstreamTaskSpec` as a dict.
        train_ids, eval_ids: ``[n, seq_len]`` token ids (``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``).
        train_mask, eval_mask: 1 for tokens, 0 for padding.
        train_types, eval_types: token type ids (0 for the first text, 1 for the second).
        train_labels, eval_labels: class ids (long) or scores (float).
        num_labels: classes, or 1 for similarity-regression.
        label_names: class names when the labels were names (their ids follow sorted order).
    """

    name: str
    index: int
    spec: dict[str, Any]
    train_ids: torch.Tensor
    train_mask: torch.Tensor
    train_types: torch.Tensor
    train_labels: torch.Tensor
    eval_ids: torch.Tensor
    eval_mask: torch.Tensor
    eval_types: torch.Tensor
    eval_labels: torch.Tensor
    num_labels: int
    label_names: list[str] | None = None

    @property
    def regression(self) -> bool:
        return self.spec["kind"] == "similarity-regression"

    def digest(self) -> str:
        """A hash of the tensors (what a finished fine-tuning's reuse depends on)."""
        h = hashlib.sha256()
        for t in (self.train_ids, self.train_mask, self.train_types, self.train_labels):
            h.update(str((tuple(t.shape), t.dtype)).encode() + t.contiguous().numpy().tobytes())
        for t in (self.eval_ids, self.eval_mask, self.eval_types, self.eval_labels):
            h.update(str((tuple(t.shape), t.dtype)).encode() + t.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def prepare_downstream(study: Study, tokenizer: Tokenizer) -> list[DownstreamData]:
    """Read and tokenise every ``downstream:`` task with the study's tokenizer.

    Raises:
        StudyError: a missing or malformed file, an unloadable dataset, bad labels, or a ``seq_len`` longer
            than a variant's positions; located at the task's field in the study.
    """
    out = []
    for index, task in enumerate(study.spec.downstream):
        train, evaluation = _examples(study, index, task)
        seq_len = task.seq_len or (study.spec.train.seq_len if study.spec.train else 64)
        for variant in study.variants:
            if seq_len > variant.config.max_position_embeddings:
                raise StudyError.single(
                    f"downstream.{index}.seq_len",
                    f"{seq_len} tokens exceed max_position_embeddings={variant.config.max_position_embeddings} "
                    f"of variant {variant.name!r}",
                    study,
                )
        labels, num_labels, names = _labels(study, index, task, train + evaluation)
        ids = {t: tokenizer.token_to_id(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
        if any(i is None for i in ids.values()):
            raise StudyError.single("tokenizer", "the tokenizer lacks [PAD], [CLS] or [SEP]", study)
        tensors = [
            _encode(tokenizer, part, seq_len, ids["[PAD]"], ids["[CLS]"], ids["[SEP]"])  # type: ignore[arg-type]
            for part in (train, evaluation)
        ]
        label_dtype = torch.float32 if task.kind == "similarity-regression" else torch.long
        out.append(
            DownstreamData(
                name=task.title,
                index=index,
                spec={**task.model_dump(mode="json"), "seq_len": seq_len},
                train_ids=tensors[0][0],
                train_mask=tensors[0][1],
                train_types=tensors[0][2],
                train_labels=torch.tensor(labels[: len(train)], dtype=label_dtype),
                eval_ids=tensors[1][0],
                eval_mask=tensors[1][1],
                eval_types=tensors[1][2],
                eval_labels=torch.tensor(labels[len(train) :], dtype=label_dtype),
                num_labels=num_labels,
                label_names=names,
            )
        )
    return out


def _examples(study: Study, index: int, task: DownstreamTaskSpec) -> tuple[list[Example], list[Example]]:
    """The task's training and eval examples."""
    loc = f"downstream.{index}"
    prefix, _, rest = task.source.partition(":")
    if prefix == "embedded":
        return (
            embedded_examples(rest, "train", task.train_examples or EMBEDDED_SIZES["train"]),
            embedded_examples(rest, "eval", task.eval_examples or EMBEDDED_SIZES["eval"]),
        )
    pair = task.columns.text_pair or ("sentence2" if task.pair else None)
    text = task.columns.text or ("sentence1" if task.pair else "sentence")
    label = task.columns.label
    try:
        if prefix == "hf":
            train = load_hf(rest, task.split, text, pair, label)
            evaluation = load_hf(rest, task.eval_source or "validation", text, pair, label)
        else:
            train = read_examples(study.resolve(task.source), text, pair, label)
            evaluation = read_examples(study.resolve(task.eval_source), text, pair, label) if task.eval_source else []
    except FileNotFoundError as e:
        where = "eval_source" if task.eval_source and str(e.filename or "").endswith(task.eval_source) else "source"
        raise StudyError.single(f"{loc}.{where}", f"file not found: {e.filename}", study) from None
    except TaskDataError as e:
        raise StudyError.single(f"{loc}.source", str(e), study) from None
    if not evaluation:  # no eval file: hold out the last eval_fraction of the training examples
        held = max(1, round(len(train) * task.eval_fraction))
        if len(train) - held < 1:
            raise StudyError.single(f"{loc}.source", f"{len(train)} example(s) are too few to hold some out", study)
        train, evaluation = train[:-held], train[-held:]
    if task.train_examples:
        train = train[: task.train_examples]
    if task.eval_examples:
        evaluation = evaluation[: task.eval_examples]
    return train, evaluation


def _labels(
    study: Study, index: int, task: DownstreamTaskSpec, examples: list[Example]
) -> tuple[list[float] | list[int], int, list[str] | None]:
    """Labels as numbers, each checked where it was read (file and line) before any training starts.

    Regression: finite numbers (JSON numbers or CSV cells). Classification: when every label is a number
    (``1``, ``1.0``, ``"1"`` and ``"1.0"`` alike: one class), each must be a non-negative integer, the class id
    itself; otherwise the labels are class names (a number among names is named by its integer value, so
    ``1`` and ``1.0`` stay one class), ids in sorted order of the names. At most :data:`MAX_LABELS` classes.
    """
    loc = f"downstream.{index}.columns.label"
    if task.kind == "similarity-regression":
        scores = []
        for example in examples:
            score = _number(example.label)
            if score is None or not math.isfinite(score):
                raise StudyError.single(
                    loc, f"{_at(example)}the similarity score {example.label!r} is not a finite number", study
                )
            scores.append(score)
        return scores, 1, None
    numbers = [_number(e.label) for e in examples]
    if all(n is not None for n in numbers):
        ids = []
        for example, number in zip(examples, numbers, strict=True):
            if number is None or not math.isfinite(number) or number < 0 or number != int(number):
                raise StudyError.single(
                    loc,
                    f"{_at(example)}the class label {example.label!r} is not a non-negative integer (class ids "
                    "count from 0; give a similarity-regression task for scores)",
                    study,
                )
            ids.append(int(number))
        names = None
    else:  # class names (or booleans): ids in sorted order of the names
        keys = [_class_name(e.label, n) for e, n in zip(examples, numbers, strict=True)]
        names = sorted(set(keys))
        position = {name: i for i, name in enumerate(names)}
        ids = [position[k] for k in keys]
    classes = task.num_labels or max(ids) + 1
    if classes > MAX_LABELS:
        raise StudyError.single(
            f"downstream.{index}.columns.label" if not task.num_labels else f"downstream.{index}.num_labels",
            f"task {task.title!r} has {classes:,} classes, more than the {MAX_LABELS:,} a downstream task may have "
            "(its head and its intervals grow with the class count); is the label column the right one?",
            study,
        )
    if classes < 2:
        raise StudyError.single(loc, "every example has the same class: nothing to classify", study)
    if max(ids) >= classes:
        raise StudyError.single(
            f"downstream.{index}.num_labels", f"is {classes}, but the data have class {max(ids)}", study
        )
    return ids, classes, names


def _number(value: Any) -> float | None:
    """A label as a number: an int or float (not a bool), or a cell that reads as one; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _class_name(label: Any, number: float | None) -> str:
    """A class name; a number among names by its integer value when it has one (``1.0`` → ``"1"``)."""
    if number is not None and math.isfinite(number) and number == int(number):
        return str(int(number))
    return str(label)


def _at(example: Example) -> str:
    return f"{example.where}: " if example.where else ""


def _encode(
    tokenizer: Tokenizer, examples: list[Example], length: int, pad: int, cls: int, sep: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``[CLS] a [SEP] (b [SEP])`` per example, the longer text cut first, padded to ``length``."""
    first = [e.ids for e in tokenizer.encode_batch([x.text for x in examples], add_special_tokens=False)]
    second: list[list[int] | None] = [None] * len(examples)
    if examples and examples[0].pair is not None:
        second = [e.ids for e in tokenizer.encode_batch([x.pair or "" for x in examples], add_special_tokens=False)]
    ids = torch.full((len(examples), length), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    types = torch.zeros((len(examples), length), dtype=torch.long)
    for row, (a, b) in enumerate(zip(first, second, strict=True)):
        a = list(a)
        b = list(b) if b is not None else None
        budget = length - (3 if b is not None else 2)
        while len(a) + len(b or []) > budget:  # longest first, as transformers' default truncation
            (a if b is None or len(a) >= len(b) else b).pop()
        tokens = [cls, *a, sep] + ([*b, sep] if b is not None else [])
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        types[row, len(a) + 2 : len(tokens)] = 1
    return ids, mask, types


# ---------------------------------------------------------------------------------------- one fine-tune
@dataclass
class DownstreamRunTask:
    """One fine-tuning: a pre-trained run (variant and seed) on one task. Plain data, as
    :class:`~bertblocks.ablation.run.RunTask`, so that every executor runs it the same way.

    Attributes:
        variant, seed: the pre-trained run's; the seed also draws the head, the batches and the dropout.
        config: the variant's config with the task's ``num_labels`` / ``problem_type``.
        task: the task's spec as a dict (with its resolved ``seq_len``).
        data: the task's tensors.
        weights: the pre-trained model's ``state_dict``, saved with ``torch.save``; ``None`` for the
            from-scratch control (:data:`FROM_SCRATCH`), fine-tuned from the random initialisation.
        threads, fingerprint, run_id: as for a pre-training run; ``pretrain_run`` is that run's id.
    """

    variant: str
    seed: int
    config: dict[str, Any]
    task: dict[str, Any]
    data: DownstreamData | None
    weights: bytes | None
    threads: int
    fingerprint: str
    run_id: str
    pretrain_run: str


def finetune_config(config: dict[str, Any], data: DownstreamData) -> dict[str, Any]:
    """The variant's config for the task: its label count, and regression for a similarity task."""
    return {
        **config,
        "num_labels": data.num_labels,
        "id2label": None,
        "label2id": None,
        "problem_type": "regression" if data.regression else "single_label_classification",
    }


def run_downstream(task: DownstreamRunTask) -> dict[str, Any]:
    """Fine-tune the pre-trained weights on the task, predict its eval examples; return the record.

    With the task's ``lr_grid``, the rate is chosen for this run: one fine-tuning per rate, each from the same
    weights and seed, on the training examples without their last :data:`~bertblocks.ablation.training.
    VALIDATION_FRACTION`, scored by the task's first metric on those held-out examples; the best (the first of
    a tie) is evaluated and recorded with ``lr`` and ``lr_search`` (rate → validation metric). The eval
    examples never take part in the choice."""
    from bertblocks.config_files import load_config

    assert task.data is not None
    data, spec = task.data, task.task
    torch.set_num_threads(task.threads)
    started = time.time()
    config = load_config(task.config)
    grid = list(spec.get("lr_grid") or [])
    search: dict[str, float | None] = {}
    if grid:
        fit, held = _validation_split(data)
        first = spec_metrics(spec)[0]
        best: tuple[float, float, torch.nn.Module, list[float], int] | None = None
        for lr in grid:
            model, losses, shared = _finetune(task, config, fit, lr)
            score = -math.inf
            if math.isfinite(losses[-1]):
                pred = _predict(model, held, spec["batch_size"], config.type_vocab_size >= 2)
                score = float(metric_batch(first, pred[None], held.eval_labels[None])[0])
            search[f"{lr:g}"] = score if math.isfinite(score) else None  # None: diverged (strict JSON)
            if best is None or score > best[0]:
                best = (score, lr, model, losses, shared)
        assert best is not None
        _, chosen, model, losses, shared = best
    else:
        chosen = spec["lr"]
        model, losses, shared = _finetune(task, config, data, chosen)
    record: dict[str, Any] = {
        "variant": task.variant,
        "seed": task.seed,
        "run_id": task.run_id,
        "pretrain_run": task.pretrain_run,
        "task": data.name,
        "kind": spec["kind"],
        "fingerprint": task.fingerprint,
        "status": "ok",
        "metrics": {},
        "shared_weights": shared,
        # what a model that ignores its input predicts, learnt from the training labels: the control rows
        "constant": constant_prediction(data),
        "torch": torch.__version__,
        "threads": task.threads,
    }
    if grid:
        record["lr"] = chosen
        record["lr_search"] = search
    if not math.isfinite(losses[-1]):
        record["status"] = "diverged"
        record["metrics"] = {"diverged_at_step": len(losses)}
        record["seconds"] = time.time() - started
        return record
    pred = _predict(model, data, spec["batch_size"], config.type_vocab_size >= 2)
    gold = data.eval_labels
    tail = losses[-max(1, len(losses) // 10) :]
    record["metrics"] = {
        **{m: float(metric_batch(m, pred[None], gold[None])[0]) for m in spec_metrics(spec)},
        "train_loss": sum(tail) / len(tail),
        "eval_examples": len(gold),
    }
    # per-example predictions and gold labels: what the intervals resample (7 significant digits, float32's)
    record["predictions"] = {
        "pred": [float(f"{v:.7g}") for v in pred.tolist()] if data.regression else pred.tolist(),
        "gold": [float(f"{v:.7g}") for v in gold.tolist()] if data.regression else gold.tolist(),
    }
    record["seconds"] = time.time() - started
    return record


def _finetune(
    task: DownstreamRunTask, config: Any, data: DownstreamData, lr: float
) -> tuple[torch.nn.Module, list[float], int]:
    """The task model from the run's seed and pre-trained weights, fine-tuned at ``lr`` on ``data``'s training
    examples; returns it, its losses, and how many pre-trained weights it loaded."""
    from .training import task_model

    spec = task.task
    torch.manual_seed(task.seed)
    model = task_model("classification", config)
    shared: dict[str, torch.Tensor] = {}
    if task.weights is not None:  # None: the from-scratch control, fine-tuned from its random initialisation
        pretrained = torch.load(io.BytesIO(task.weights), map_location="cpu", weights_only=True)
        own = model.state_dict()
        shared = {k: v for k, v in pretrained.items() if k in own and own[k].shape == v.shape}
        if not shared:
            raise InputError(f"the pre-trained weights of {task.pretrain_run} share no weight with the task model")
        model.load_state_dict(shared, strict=False)
    types = config.type_vocab_size >= 2  # a model without token types (ModernBERT) reads the pair untyped
    generator = torch.Generator().manual_seed(task.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=spec["weight_decay"])
    model.train()
    losses: list[float] = []
    for _ in range(spec["steps"]):
        rows = torch.randint(0, len(data.train_ids), (spec["batch_size"],), generator=generator)
        out = model(
            input_ids=data.train_ids[rows],
            attention_mask=data.train_mask[rows],
            labels=data.train_labels[rows],
            **({"token_type_ids": data.train_types[rows]} if types else {}),
        )
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(float(out.loss.detach()))
        if not math.isfinite(losses[-1]):
            break
    return model, losses, len(shared)


@torch.no_grad()
def _predict(model: torch.nn.Module, data: DownstreamData, batch_size: int, types: bool) -> torch.Tensor:
    """The model's predictions for ``data``'s eval examples: a class id, or a score for regression."""
    model.eval()
    predictions: list[torch.Tensor] = []
    for start in range(0, len(data.eval_ids), batch_size):
        part = slice(start, start + batch_size)
        logits = model(
            input_ids=data.eval_ids[part],
            attention_mask=data.eval_mask[part],
            **({"token_type_ids": data.eval_types[part]} if types else {}),
        ).logits.float()
        predictions.append(logits[:, 0] if data.regression else logits.argmax(-1))
    return torch.cat(predictions)


def _validation_split(data: DownstreamData) -> tuple[DownstreamData, DownstreamData]:
    """``(fit, validation)``: the training examples without their last share, and those examples in the eval
    slots (the eval examples are in neither)."""
    from .training import VALIDATION_FRACTION

    held = max(1, round(len(data.train_ids) * VALIDATION_FRACTION))
    if len(data.train_ids) - held < 1:
        raise InputError(f"{len(data.train_ids)} training examples are too few to hold a validation split out")
    keep = slice(None, -held)
    out = slice(-held, None)
    fit = replace(
        data,
        train_ids=data.train_ids[keep],
        train_mask=data.train_mask[keep],
        train_types=data.train_types[keep],
        train_labels=data.train_labels[keep],
    )
    validation = replace(
        data,
        eval_ids=data.train_ids[out],
        eval_mask=data.train_mask[out],
        eval_types=data.train_types[out],
        eval_labels=data.train_labels[out],
    )
    return fit, validation


def constant_prediction(data: DownstreamData) -> float:
    """The best input-blind prediction by the training labels: the majority class (the smallest id of a tie),
    or the mean score for regression."""
    if data.regression:
        return float(data.train_labels.double().mean())
    return float(torch.bincount(data.train_labels.long(), minlength=data.num_labels).argmax())


def spec_metrics(spec: dict[str, Any]) -> list[str]:
    """The metrics a task's spec (as a dict) reports."""
    return DownstreamTaskSpec.model_validate(spec).reported


# ---------------------------------------------------------------------------------------------- metrics
def metric_batch(metric: str, pred: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    """``metric`` of each row of ``pred`` against the same row of ``gold`` (``[B, n]`` each): ``[B]`` doubles."""
    if metric == "accuracy":
        return (pred == gold).double().mean(-1)
    if metric == "f1":
        return _macro_f1(pred.long(), gold.long())
    if metric == "spearman":
        return _pearson(_average_ranks(pred.double()), _average_ranks(gold.double()))
    if metric == "pearson":
        return _pearson(pred.double(), gold.double())
    raise InputError(f"unknown downstream metric {metric!r}")


def _macro_f1(pred: torch.Tensor, gold: torch.Tensor) -> torch.Tensor:
    # counts per row and class by one bincount each ([B, classes]), never a one-hot [B, n, classes] (with
    # 3,000 classes the bootstrap's one-hots asked for 10.7 GB); 2·tp + fp + fn = predicted + gold counts
    rows, classes = pred.shape[0], int(max(pred.max(), gold.max())) + 1
    offset = torch.arange(rows)[:, None] * classes

    def count(ids: torch.Tensor) -> torch.Tensor:
        return torch.bincount(ids, minlength=rows * classes).view(rows, classes).double()

    tp = count((gold + offset)[pred == gold])
    denominator = count((pred + offset).reshape(-1)) + count((gold + offset).reshape(-1))
    present = denominator > 0  # a class in neither the gold labels nor the predictions does not count
    f1 = torch.where(present, 2 * tp / denominator.clamp(min=1), torch.zeros_like(tp))
    return f1.sum(-1) / present.sum(-1).clamp(min=1)


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks along the last dimension, tied values sharing their average rank."""
    ordered = x.sort(-1).values
    below = torch.searchsorted(ordered, x, right=False)
    up_to = torch.searchsorted(ordered, x, right=True)
    return (below + up_to + 1).double() / 2


def _pearson(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x - x.mean(-1, keepdim=True)
    y = y - y.mean(-1, keepdim=True)
    scale = (x.square().sum(-1) * y.square().sum(-1)).sqrt()
    return torch.where(scale > 0, (x * y).sum(-1) / scale.clamp(min=1e-300), torch.zeros_like(scale))


def resample_indices(n: int, resamples: int = RESAMPLES) -> torch.Tensor:
    """``[resamples, n]`` bootstrap index sets: a function of ``n`` only, so every run gets the same ones."""
    return torch.cat(list(resample_chunks(n, resamples, resamples)))


def resample_chunks(n: int, resamples: int = RESAMPLES, chunk: int = RESAMPLES) -> Iterator[torch.Tensor]:
    """:func:`resample_indices` in ``[≤ chunk, n]`` parts, drawn one after another from the one generator
    (the same index sets, never all of them in memory at once)."""
    generator = torch.Generator().manual_seed(BOOTSTRAP_SEED)
    for start in range(0, resamples, chunk):
        yield torch.randint(0, n, (min(chunk, resamples - start), n), generator=generator)


def bootstrap_chunk(metric: str, n: int, classes: int, budget: int = BOOTSTRAP_BYTES) -> int:
    """Resamples computed at once so that the bootstrap holds at most about ``budget`` bytes: per resample,
    its ``n`` indices and the predictions and gold values they pick (and their ranks, for ``spearman``), and
    ``classes`` counts (for ``f1``)."""
    per_resample = 8 * (6 * n + (4 * classes if metric == "f1" else 0))
    return max(1, budget // per_resample)


def bootstrap_interval(
    metric: str,
    gold: Sequence[float],
    preds: dict[int, Sequence[float]],
    baseline: dict[int, Sequence[float]] | None = None,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
) -> Interval | None:
    """The interval of ``metric`` over seeds and eval examples (see the module doc), or of its paired
    difference with ``baseline`` (seed → predictions) over the seeds both have; ``None`` without a seed."""
    seeds = sorted(set(preds) & set(baseline)) if baseline is not None else sorted(preds)
    if not seeds:
        return None
    target = torch.tensor(gold, dtype=torch.float64)
    columns = {seed: torch.tensor(preds[seed], dtype=torch.float64) for seed in seeds}
    base = {seed: torch.tensor(baseline[seed], dtype=torch.float64) for seed in seeds} if baseline else {}
    every = [target, *columns.values(), *base.values()]
    classes = max(1, int(max(float(t.max()) for t in every)) + 1) if len(target) else 1  # for f1's counts

    def values(p: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        if rows is None:
            return metric_batch(metric, p[None], target[None])
        return metric_batch(metric, p[rows], target[rows])

    per_seed = []
    for seed in seeds:
        full = values(columns[seed], None)
        if baseline is not None:
            full = full - values(base[seed], None)
        per_seed.append(float(full[0]))
    # the resamples in chunks: memory bounded by BOOTSTRAP_BYTES whatever the eval set and the class count
    parts: list[torch.Tensor] = []
    for index in resample_chunks(len(target), resamples, bootstrap_chunk(metric, len(target), classes)):
        part = [values(columns[seed], index) for seed in seeds]
        if baseline is not None:
            part = [p - values(base[seed], index) for p, seed in zip(part, seeds, strict=True)]
        parts.append(torch.stack(part))
    matrix = torch.cat(parts, dim=1)  # [seeds, resamples]
    count, samples = len(seeds), len(target)
    estimate = math.fsum(per_seed) / count
    terms: list[tuple[float, float]] = []
    if count > 1:
        terms.append((statistics.variance(per_seed) / count, count - 1))
        each = float(matrix.var(-1).mean())
        averaged = float(matrix.mean(0).var())
        terms.append((max(0.0, averaged - (each - averaged) / (count - 1)), samples - 1))
        sources = "seeds+samples"
    else:
        terms.append((float(matrix[0].var()), samples - 1))
        sources = "samples"
    var = sum(v for v, _ in terms)
    if samples < 2 or var == 0:
        ends = (estimate, estimate) if var == 0 and samples > 1 else (math.nan, math.nan)
        df = math.inf if var == 0 and samples > 1 else math.nan
        return Interval(estimate, *ends, count, samples, sources if samples > 1 else "none", level, df)
    df = var**2 / sum(v**2 / d for v, d in terms if v > 0)
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return Interval(estimate, estimate - half, estimate + half, count, samples, sources, level, df)


# ---------------------------------------------------------------------------------------------- summary
@dataclass
class DownstreamSummary:
    """One task metric of one variant: the mean over seeds, its interval, the paired difference."""

    task: str
    metric: str
    seeds: list[int]
    mean: float
    interval: Interval | None
    difference: Interval | None = None
    examples: int = 0
    diverged: list[int] = field(default_factory=list)
    #: with the task's ``lr_grid``: the rate each seed's fine-tuning chose (in seed order)
    lrs: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.task}/{self.metric}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "metric": self.metric,
            "seeds": self.seeds,
            "mean": self.mean,
            "interval": self.interval.as_dict() if self.interval is not None else None,
            "difference": {**self.difference.as_dict(), "distinguishable": self.difference.distinguishable}
            if self.difference is not None
            else None,
            "examples": self.examples,
            "diverged_seeds": self.diverged,
            "lrs": self.lrs,
        }


def attach(
    summaries: list[VariantSummary],
    records: list[dict[str, Any]],
    tasks: list[tuple[str, list[str]]],
    baseline: str | None,
    level: float = LEVEL,
) -> None:
    """Fill each summary's ``downstream`` (``task/metric`` → :class:`DownstreamSummary`) from the records.

    Args:
        summaries: the variants' summaries (:func:`~bertblocks.ablation.report.summarize`).
        records: the downstream records.
        tasks: ``(task name, metrics)`` in study order.
        baseline: the variant differences are against.
        level: the confidence level.
    """

    def runs(variant: str, task: str) -> dict[int, dict[str, Any]]:
        return {r["seed"]: r for r in records if r["variant"] == variant and r["task"] == task}

    for summary in summaries:
        for task, metrics in tasks:
            mine = runs(summary.variant, task)
            ok = {s: r for s, r in sorted(mine.items()) if r.get("status") == "ok"}
            diverged = sorted(s for s, r in mine.items() if r.get("status") == "diverged")
            theirs = (
                {s: r for s, r in runs(baseline, task).items() if r.get("status") == "ok"}
                if baseline is not None and summary.variant != baseline
                else None
            )
            for metric in metrics:
                if not ok:
                    if diverged:
                        summary.downstream[f"{task}/{metric}"] = DownstreamSummary(
                            task, metric, [], math.nan, None, diverged=diverged
                        )
                    continue
                gold = next(iter(ok.values()))["predictions"]["gold"]
                entry = DownstreamSummary(
                    task,
                    metric,
                    list(ok),
                    statistics.fmean(float(r["metrics"][metric]) for r in ok.values()),
                    _interval(metric, ok, gold, None, level),
                    examples=len(gold),
                    diverged=diverged,
                    lrs=[float(r["lr"]) for r in ok.values() if isinstance(r.get("lr"), int | float)],
                )
                if theirs:
                    entry.difference = _interval(metric, ok, gold, theirs, level)
                summary.downstream[entry.key] = entry


def _interval(
    metric: str,
    runs: dict[int, dict[str, Any]],
    gold: list[float],
    baseline: dict[int, dict[str, Any]] | None,
    level: float,
) -> Interval | None:
    preds = {s: r["predictions"]["pred"] for s, r in runs.items()}
    if metric == "accuracy":  # a mean of per-example 0/1 values: the eval loss's analytic interval
        correct = {s: [float(p == g) for p, g in zip(pred, gold, strict=True)] for s, pred in preds.items()}
        values = {s: float(r["metrics"][metric]) for s, r in runs.items()}
        if baseline is None:
            return interval(list(correct.values()), list(values.values()), level)
        base = {s: r["predictions"]["pred"] for s, r in baseline.items()}
        base_correct = {s: [float(p == g) for p, g in zip(pred, gold, strict=True)] for s, pred in base.items()}
        base_values = {s: float(r["metrics"][metric]) for s, r in baseline.items()}
        return paired_difference(correct, base_correct, values, base_values, level)  # type: ignore[arg-type]
    base_preds = {s: r["predictions"]["pred"] for s, r in baseline.items()} if baseline is not None else None
    return bootstrap_interval(metric, gold, preds, base_preds, level)


@dataclass
class ControlRow:
    """A reference row of the downstream table: what a model reaches without the study's pre-training.

    Attributes:
        name: the row's title.
        entries: ``task/metric`` → its summary (no difference: a control is not a variant).
        note: how the row was made.
    """

    name: str
    entries: dict[str, DownstreamSummary]
    note: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "note": self.note, "entries": {k: e.as_dict() for k, e in self.entries.items()}}


def controls(
    records: list[dict[str, Any]], tasks: list[tuple[str, list[str]]], baseline: str | None, level: float = LEVEL
) -> list[ControlRow]:
    """The control rows of the downstream table, from the fine-tuning records:

    * ``majority / mean``: every eval example predicted as the training labels' majority class (a regression
      task: their mean score, whose correlations are 0 by definition); the records of a version before this
      one do not say, and then the eval labels' majority stands in (the note says so);
    * ``chance``: a class drawn uniformly for every example (a regression task: the gold scores in a random
      order), from one fixed generator;
    * ``from scratch``: the :data:`FROM_SCRATCH` records, the baseline's architecture fine-tuned by the same
      recipe and seeds from random weights (present when the study ran them).

    The first two have the eval examples' noise only (one "seed"; bootstrap over examples).
    """
    rows = {"majority": ControlRow("majority / mean", {}, ""), "chance": ControlRow("chance", {}, "")}
    scratch = ControlRow(f"from scratch ({baseline})" if baseline else "from scratch", {}, "")
    notes: dict[str, set[str]] = {"majority": set(), "chance": set()}
    for task, metrics in tasks:
        ok = [r for r in records if r["task"] == task and r.get("status") == "ok"]
        if not ok:
            continue
        first = ok[0]
        gold = [float(g) for g in first["predictions"]["gold"]]
        regression = first.get("kind") == "similarity-regression"
        if "constant" in first:
            constant = float(first["constant"])
            notes["majority"].add("the training labels")
        else:
            majority = max(set(gold), key=lambda c: (gold.count(c), -c))  # the smallest id of a tie
            constant = statistics.fmean(gold) if regression else float(majority)
            notes["majority"].add("the eval labels (records of an older version keep no training labels)")
        generator = torch.Generator().manual_seed(CHANCE_SEED)
        if regression:
            chance = [gold[i] for i in torch.randperm(len(gold), generator=generator).tolist()]
        else:
            classes = int(max(gold)) + 1
            chance = torch.randint(0, classes, (len(gold),), generator=generator).double().tolist()
        made = [(rows["majority"], [constant] * len(gold)), (rows["chance"], chance)]
        for metric in metrics:
            for row, pred in made:
                iv = bootstrap_interval(metric, gold, {0: pred}, level=level)
                row.entries[f"{task}/{metric}"] = DownstreamSummary(
                    task, metric, [0], iv.estimate if iv is not None else math.nan, iv, examples=len(gold)
                )
        runs = {r["seed"]: r for r in ok if r["variant"] == FROM_SCRATCH}
        for metric in metrics if runs else []:
            entry = DownstreamSummary(
                task,
                metric,
                sorted(runs),
                statistics.fmean(float(r["metrics"][metric]) for r in runs.values()),
                _interval(metric, dict(sorted(runs.items())), gold, None, level),
                examples=len(gold),
            )
            scratch.entries[entry.key] = entry
    rows["majority"].note = "majority class (regression: mean score) of " + " / ".join(sorted(notes["majority"]))
    rows["chance"].note = "a uniformly drawn class per example (regression: the gold scores shuffled)"
    scratch.note = "the baseline's architecture fine-tuned from random weights, same recipe and seeds"
    return [row for row in (rows["majority"], rows["chance"], scratch) if row.entries]


def pair_difference(
    records: list[dict[str, Any]], key: str, variant: str, against: str, level: float = LEVEL
) -> Interval | None:
    """``variant − against`` on ``key`` (``task/metric``), paired by seed and eval example, from the fine-tuning
    records (finished ones only); ``None`` when they share no seed."""
    task, metric = key.rsplit("/", 1)

    def runs(name: str) -> dict[int, dict[str, Any]]:
        return {r["seed"]: r for r in records if r["variant"] == name and r["task"] == task and r.get("status") == "ok"}

    mine, theirs = runs(variant), runs(against)
    if not mine or not theirs:
        return None
    gold = next(iter(mine.values()))["predictions"]["gold"]
    return _interval(metric, mine, gold, theirs, level)


def format_table(summaries: list[VariantSummary], control_rows: Sequence[ControlRow] = ()) -> str:
    """The downstream block of the study's table: per task metric, ``mean ± half-width`` and the paired
    difference against the baseline (``≈`` when not distinguishable), then the control rows (:func:`controls`);
    empty without downstream tasks."""
    from .report import _pm, _signed

    keys: list[str] = []
    for s in summaries:
        keys += [k for k in s.downstream if k not in keys]
    if not keys:
        return ""
    baseline = next((s.baseline for s in summaries if s.baseline), None)
    method = next(
        (
            e.difference.adjustment
            for s in summaries
            for e in s.downstream.values()
            if e.difference is not None and e.difference.adjustment is not None
        ),
        None,
    )
    tag = f" ({SHORT_NAMES[method]})" if method is not None else ""
    header = ["variant"]
    for key in keys:
        task, metric = key.rsplit("/", 1)
        header += [f"{task} {TITLES.get(metric, metric)}", f"Δ vs {baseline}{tag}" if baseline else "Δ"]
    rows = []
    for s in summaries:
        cells = [s.variant]
        for key in keys:
            entry = s.downstream.get(key)
            if entry is None or not entry.seeds:
                cells += ["-", "-"]
                continue
            iv = entry.interval
            cells.append(_pm(iv.estimate, iv.half_width) if iv is not None and iv.known else f"{entry.mean:.3f}")
            if entry.difference is not None:
                cells.append(_signed(entry.difference))
            else:
                cells.append("(baseline)" if s.baseline is None else "-")
        rows.append(cells)
    for control in control_rows:
        cells = [control.name]
        for key in keys:
            entry = control.entries.get(key)
            iv = entry.interval if entry is not None else None
            if entry is None:
                cells += ["-", ""]
            else:
                cells += [_pm(iv.estimate, iv.half_width) if iv is not None and iv.known else f"{entry.mean:.3f}", ""]
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs).rstrip()

    lines = ["downstream: each run fine-tuned from its pre-trained weights", line(header)]
    lines.append("  ".join("-" * w for w in widths))
    lines += [line(cells) for cells in rows[: len(summaries)]]
    if control_rows:
        lines.append("  ".join("·" * w for w in widths))  # the controls: references, not variants
        lines += [line(cells) for cells in rows[len(summaries) :]]
    examples = {}
    for s in summaries:
        for entry in s.downstream.values():
            if entry.examples:
                examples.setdefault(entry.task, entry.examples)
    level = next((e.interval.level for s in summaries for e in s.downstream.values() if e.interval), LEVEL)
    notes = [
        f"± is the half-width of a {level:.0%} interval over seeds and eval examples ("
        + ", ".join(f"{task}: {n:,}" for task, n in examples.items())
        + f"); accuracy's is analytic, F1's and the correlations' from {RESAMPLES:,} bootstrap resamples",
        f"Δ is paired with {baseline} (same seeds, same eval examples); ≈: not distinguishable from 0"
        + (
            " after the adjustment the decisions line above states (one family with the pre-training Δ)"
            if method is not None
            else " (its interval contains 0)"
        ),
    ]
    chosen: dict[str, list[str]] = {}
    for s in summaries:
        for e in s.downstream.values():
            text = f"{s.variant} {'/'.join(f'{lr:g}' for lr in e.lrs)}"
            if e.lrs and text not in chosen.setdefault(e.task, []):
                chosen[e.task].append(text)
    notes += [
        f"{task}: fine-tuning rate each seed chose (in seed order) on a validation split of the training "
        f"examples: {'; '.join(rates)}"
        for task, rates in chosen.items()
    ]
    notes += [f"control {c.name}: {c.note}" for c in control_rows]
    if not any(c.name.startswith("from scratch") for c in control_rows):
        notes.append("no from-scratch control: the study ran without it (from_scratch: false, or an older version)")
    notes += sorted(
        {
            f"{s.variant}: fine-tuning on {e.task} diverged for seed(s) {', '.join(map(str, e.diverged))}; left out"
            for s in summaries
            for e in s.downstream.values()
            if e.diverged
        }
    )
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines)


def csv_columns(summaries: list[VariantSummary]) -> tuple[list[str], list[list[Any]]]:
    """Header and one row of cells per summary for results.csv: ``TASK/METRIC`` (mean), its interval, and
    the paired difference with its interval, its raw and adjusted p-values, and whether it is distinguishable
    (the adjusted decision)."""
    from .report import p_columns

    keys: list[str] = []
    for s in summaries:
        keys += [k for k in s.downstream if k not in keys]
    header = [
        f"{k}{end}"
        for k in keys
        for end in (
            "",
            "_ci_low",
            "_ci_high",
            "_delta",
            "_delta_ci_low",
            "_delta_ci_high",
            "_delta_p",
            "_delta_p_adjusted",
            "_delta_adjustment",
            "_delta_distinguishable",
        )
    ]
    rows = []
    for s in summaries:
        cells: list[Any] = []
        for key in keys:
            e = s.downstream.get(key)
            iv = e.interval if e is not None else None
            d = e.difference if e is not None else None
            cells += [e.mean if e is not None and e.seeds else ""]
            cells += [iv.low, iv.high] if iv is not None and iv.known else ["", ""]
            cells += (
                [d.estimate, d.low, d.high, *p_columns(d), d.distinguishable]
                if d is not None and d.known
                else [d.estimate if d is not None else "", "", "", "", "", "", ""]
            )
        rows.append(cells)
    return header, rows
