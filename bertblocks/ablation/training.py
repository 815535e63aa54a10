"""Short training runs for a quality number: masked-LM pre-training or sequence classification.

Everything random is drawn from generators seeded by the run's seed (initial weights, batch order,
masking, dropout), so a run is a pure function of (config, data, seed, thread count): a local worker and a
Ray task give the same losses. Evaluation masks the held-out blocks with one fixed generator, the same for
every variant and seed, so eval losses compare like for like.

The same loop runs data-parallel (:mod:`bertblocks.ablation.ddp`): each rank takes its slice of every
global batch, and DDP averages the gradients.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bertblocks.config import BertConfig

from ..errors import InputError, UnsupportedError
from .data import PreparedData

if TYPE_CHECKING:
    from .study import Study

EVAL_SEED = 20240601  # masking of the eval set: fixed, shared by all runs of all studies


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


def task_model(task: str, config: BertConfig) -> nn.Module:
    """A randomly initialised model with the task's head (uses the current torch seed): the head the config's
    family gives that task (ELECTRA's masked LM projects to its embedding size, RoBERTa classifies with
    ``dense → tanh → out_proj``), so a study on a family trains the family's own model. A family whose transformers
    classes have no masked LM (BertGeneration's are a backbone and a causal LM) trains BERT's ``masked_lm`` head on
    its backbone for the ``mlm`` task."""
    from bertblocks.hf.config_json import config_from_hf, config_to_hf
    from bertblocks.hf.families import get_family
    from bertblocks.zoo import create_model

    # the class names of the task's models (NeoBERT's masked LM is NeoBERTLMHead)
    suffixes = {"mlm": ("ForMaskedLM", "LMHead"), "classification": ("ForSequenceClassification",)}[task]
    family = get_family(config.family, source=None)
    architecture = next((a for a in family.architectures if a.endswith(suffixes)), None)
    if architecture is None and task == "mlm":
        return create_model(config, head={"name": "masked_lm"})
    if architecture is None:
        raise UnsupportedError(
            f"the {config.family} family has no {suffixes[0][3:]} head, which the {task} task trains"
        )
    # the head as a checkpoint of that class would be read: the family fills in options that follow from the
    # config (ELECTRA's generator head narrows to embedding_size)
    head = config_from_hf({**config_to_hf(config), "architectures": [architecture]})["head"]
    return create_model(config, head=head)


def mask_tokens(
    ids: torch.Tensor, data: PreparedData, probability: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking: pick ``probability`` of the ordinary tokens; of those 80% → [MASK], 10% → random,
    10% kept. Labels are -100 elsewhere (ignored by the loss)."""
    special = torch.isin(ids, torch.tensor(data.special_ids))
    chosen = (torch.rand(ids.shape, generator=generator) < probability) & ~special
    if not chosen.any():  # a batch with nothing to predict would give a NaN loss
        position = int(torch.nonzero(~special)[0, 1]) if (~special).any() else 0
        chosen[0, position] = True
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    masked = ids.clone()
    masked[chosen & (roll < 0.8)] = data.mask_id
    random_tokens = torch.randint(0, data.vocab_size, ids.shape, generator=generator)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)
    masked[swap] = random_tokens[swap]
    return masked, labels


def _batch(data: PreparedData, rows: torch.Tensor, spec: Any, generator: torch.Generator, train: bool) -> Batch:
    ids = (data.train_ids if train else data.eval_ids)[rows]
    mask = (data.train_mask if train else data.eval_mask)[rows]
    if data.task == "mlm":
        ids, labels = mask_tokens(ids, data, spec.mask_prob, generator)
    else:
        labels = (data.train_labels if train else data.eval_labels)[rows]  # type: ignore[index]
    return Batch(ids, mask, labels)


#: a study trained to a token, FLOP or time budget stops at the latest after this many times ``train.steps``
BUDGET_STEP_CAP = 20


def train_flops_per_token(config: BertConfig, seq_len: int) -> float:
    """Training FLOPs per token: three times the backbone's analytic forward FLOPs (the backward pass costs
    about twice the forward). The head is left out: a masked-LM head costs every variant of one width and
    vocabulary the same."""
    from .flops import analytic_flops_per_token

    return 3 * analytic_flops_per_token(config, seq_len).per_token


def resolved_train(study: Study) -> dict[str, Any] | None:
    """The study's ``train:`` section as its runs get it: a ``tokens`` or ``flops`` budget without a
    ``budget_value`` gets what the baseline spends in ``steps`` full batches (``steps × batch_size × seq_len``
    tokens, times the baseline's :func:`train_flops_per_token` for FLOPs), so every variant trains on the
    compute the baseline's step count means."""
    spec = study.spec.train
    if spec is None:
        return None
    train = spec.model_dump(mode="json")
    if spec.budget in ("tokens", "flops") and spec.budget_value is None:
        tokens = float(spec.steps * spec.batch_size * spec.seq_len)
        if spec.budget == "tokens":
            train["budget_value"] = tokens
        else:
            baseline = next(v for v in study.variants if v.name == study.baseline)
            train["budget_value"] = tokens * train_flops_per_token(baseline.config, spec.seq_len)
    return train


def train_model(
    model: nn.Module,
    data: PreparedData,
    spec: Any,
    seed: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    flops_per_token: float | None = None,
) -> dict[str, Any]:
    """Train ``model`` (maybe DDP- or FSDP-wrapped) for ``spec.steps`` steps; returns the final training loss,
    the time, and the throughput.

    Every rank draws the same global batch from a generator seeded with ``seed`` and keeps its slice of
    it, so one process with batch ``B`` and ``n`` processes with ``B / n`` each see the same examples.

    A loss that is not finite (NaN or inf) means the run diverged: the result then holds
    ``diverged_at_step`` (1-based) instead of ``train_loss``. A single process stops there; DDP ranks run
    every step (stopping one rank alone would leave the others waiting in the gradient all-reduce).

    ``train_tokens`` counts the real (not padding) tokens of every global batch the steps took, over all
    ranks, and ``train_tokens_per_s`` is that count over ``train_seconds`` (the wall time of the loop:
    batching, forward, backward and optimizer steps), so a data-parallel run reports the throughput of
    the whole group.

    ``spec.budget`` decides when to stop: after ``spec.steps`` steps (``steps``), or at the first step that
    brings the real tokens, the training FLOPs (tokens × ``flops_per_token``) or the seconds spent to
    ``spec.budget_value`` or beyond, so runs of different variants stop within one step of the same compute;
    never after more than :data:`BUDGET_STEP_CAP` × ``spec.steps`` steps (``budget_reached`` then says
    ``False``). Under a budget the result also holds ``train_steps``, ``train_flops`` and the budget.
    """
    if spec.batch_size % world_size:
        raise InputError(f"train.batch_size {spec.batch_size} must be divisible by the {world_size} DDP processes")
    budget = getattr(spec, "budget", "steps")
    if budget == "flops" and flops_per_token is None:
        raise InputError("budget: flops needs the variant's flops_per_token")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    model.train()
    per_rank = spec.batch_size // world_size
    losses: list[float] = []
    tokens = 0
    start = time.perf_counter()
    for _ in range(spec.steps if budget == "steps" else spec.steps * BUDGET_STEP_CAP):
        # at least one step: a budget is spent by steps, and a run without one has nothing to report
        if (
            budget != "steps"
            and losses
            and _spent(budget, tokens, flops_per_token, start, world_size) >= spec.budget_value
        ):
            break
        rows = torch.randint(0, len(data.train_ids), (spec.batch_size,), generator=generator)
        batch = _batch(data, rows, spec, generator, train=True)
        tokens += int(batch.attention_mask.sum())  # the global batch: every rank drew all of it
        part = slice(rank * per_rank, (rank + 1) * per_rank)
        out = model(
            input_ids=batch.input_ids[part], attention_mask=batch.attention_mask[part], labels=batch.labels[part]
        )
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        optimizer.step()
        losses.append(float(out.loss.detach()))
        if not math.isfinite(losses[-1]) and world_size == 1:
            break
    seconds = time.perf_counter() - start
    if world_size > 1:  # each rank's loss is on its slice: the group's is their mean (what DDP minimises)
        import torch.distributed as dist

        gathered = torch.tensor(losses, dtype=torch.float64)
        dist.all_reduce(gathered)
        losses = (gathered / world_size).tolist()
    timing: dict[str, Any] = {"train_seconds": seconds, "train_tokens": tokens, "train_tokens_per_s": tokens / seconds}
    timing["budget"] = budget
    if budget != "steps":
        spent = _spent(budget, tokens, flops_per_token, start, world_size) if budget != "seconds" else seconds
        timing |= {
            "train_steps": len(losses),
            "budget": budget,
            "budget_value": spec.budget_value,
            "budget_reached": spent >= spec.budget_value,
        }
        if flops_per_token is not None:
            timing["train_flops"] = tokens * flops_per_token
    diverged = next((step for step, loss in enumerate(losses, 1) if not math.isfinite(loss)), None)
    if diverged is not None:
        return {"diverged_at_step": diverged, **timing}
    tail = losses[-max(1, len(losses) // 10) :]  # the last tenth: less noisy than the very last step
    return {"train_loss": sum(tail) / len(tail), **timing}


def _spent(budget: str, tokens: int, flops_per_token: float | None, start: float, world_size: int) -> float:
    """How much of a ``tokens``, ``flops`` or ``seconds`` budget the steps so far used."""
    if budget == "tokens":
        return float(tokens)
    if budget == "flops":
        assert flops_per_token is not None
        return tokens * flops_per_token
    elapsed = time.perf_counter() - start
    if world_size > 1:  # every rank must stop at the same step: the slowest rank's clock decides
        import torch.distributed as dist

        clock = torch.tensor([elapsed], dtype=torch.float64)
        dist.all_reduce(clock, op=dist.ReduceOp.MAX)
        elapsed = float(clock[0])
    return elapsed


def eval_rows(data: PreparedData, spec: Any) -> tuple[int, int | None]:
    """``(rows evaluated, rows asked for)``: ``eval_batches × batch_size`` held-out rows, or all of them when
    ``eval_batches`` is not set (``None`` asked); never more than the held-out set has."""
    available = len(data.eval_ids)
    if spec.eval_batches is None:
        return available, None
    asked = spec.eval_batches * spec.batch_size
    return min(available, asked), asked


def _eval_passes(data: PreparedData, spec: Any) -> Iterator[tuple[torch.Tensor, Batch]]:
    """The eval batches, masked with the one fixed generator: what :func:`evaluate` scores and
    :func:`eval_sentences` reads, so that both see the same masked tokens in the same order."""
    generator = torch.Generator().manual_seed(EVAL_SEED)
    n, _ = eval_rows(data, spec)
    for start in range(0, n, spec.batch_size):
        rows = torch.arange(start, min(start + spec.batch_size, n))
        yield rows, _batch(data, rows, spec, generator, train=False)


def _sentence_ids(data: PreparedData) -> torch.Tensor:
    """``[rows, seq_len]``: the sentence of every eval position (``-1`` for a block's ``[CLS]``). The eval blocks
    cut one stream of sentences, each ending in ``[SEP]`` (:func:`~bertblocks.ablation.data.prepare`), so a
    token's sentence is the number of ``[SEP]`` before it in that stream; a sentence cut by a block boundary
    keeps one id."""
    body = data.eval_ids[:, 1:]
    seps = (body == data.sep_id).long().reshape(-1)
    ids = (torch.cumsum(seps, 0) - seps).reshape(body.shape)
    return torch.cat([torch.full((len(body), 1), -1, dtype=torch.long), ids], 1)


def eval_sentences(data: PreparedData, spec: Any) -> list[int]:
    """The sentence of every masked eval token, in :func:`evaluate`'s order (masked-LM only)."""
    ids = _sentence_ids(data)
    out: list[int] = []
    for rows, batch in _eval_passes(data, spec):
        out += ids[rows][batch.labels != -100].tolist()
    return out


@torch.no_grad()
def evaluate(model: nn.Module, data: PreparedData, spec: Any) -> dict[str, Any]:
    """Eval loss over the held-out rows (see :func:`eval_rows`); perplexity for mlm, accuracy for
    classification.

    Besides the metrics, ``eval_samples`` holds what they average over, one value per masked token (mlm) or
    per example (classification): ``loss``, ``correct`` (0/1, classification), and ``sentence`` (mlm: the
    sentence of each token, see :func:`eval_sentences`). Every run evaluates the
    same samples in the same order (the eval set is masked with one fixed generator), so the summaries can
    pair them across seeds and variants (:mod:`bertblocks.ablation.stats`).
    """
    model.eval()
    n, asked = eval_rows(data, spec)
    losses: list[torch.Tensor] = []
    correct: list[torch.Tensor] = []
    sentences: list[torch.Tensor] = []
    ids = _sentence_ids(data) if data.task == "mlm" else None
    for rows, batch in _eval_passes(data, spec):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        logits = out.logits.float()
        if ids is not None:
            keep = batch.labels != -100
            losses.append(nn.functional.cross_entropy(logits[keep], batch.labels[keep], reduction="none"))
            sentences.append(ids[rows][keep])
        else:
            losses.append(nn.functional.cross_entropy(logits, batch.labels, reduction="none"))
            correct.append((logits.argmax(-1) == batch.labels).long())
    per_sample = torch.cat(losses).double()
    loss = float(per_sample.mean())  # a per-token (per-example) mean, as the samples are
    result: dict[str, Any] = {"eval_loss": loss, "eval_rows": n}
    if asked is not None:
        result["eval_rows_asked"] = asked
    samples: dict[str, Any] = {
        "unit": "token" if data.task == "mlm" else "example",
        # 7 significant digits: float32's own precision, and a record a third the size of full repr
        "loss": [float(f"{v:.7g}") for v in per_sample.tolist()],
    }
    if data.task == "mlm":
        result["perplexity"] = math.exp(min(loss, 50.0))
        samples["sentence"] = torch.cat(sentences).tolist()  # what the intervals resample (not single tokens)
    else:
        hits = torch.cat(correct)
        result["accuracy"] = float(hits.double().mean())
        samples["correct"] = hits.tolist()
    result["eval_samples"] = samples
    return result


def train_and_evaluate(
    config: BertConfig, data: PreparedData, spec: Any, seed: int, *, keep_weights: bool = False
) -> dict[str, Any]:
    """One single-process training run: model from ``seed``, training, evaluation (with the per-sample
    values in ``eval_samples``, see :func:`evaluate`); with ``keep_weights``, also the trained
    ``state_dict`` as ``torch.save`` bytes in ``weights`` (for downstream fine-tuning).

    With ``spec.lr_grid``, the learning rate is chosen for this variant and seed: one model per rate, each
    from the same seed, trained on the training rows without a validation split (:func:`validation_split`)
    and scored on that split; the one of the lowest validation loss is kept, evaluated on the eval set and
    reported with ``lr`` and ``lr_search`` (rate → validation loss). The eval set never takes part in the
    choice, and every seed chooses on its own, so the choice's luck is part of the seeds' spread."""
    flops = train_flops_per_token(config, spec.seq_len)
    grid = list(getattr(spec, "lr_grid", None) or [])
    if not grid:
        torch.manual_seed(seed)
        model = task_model(data.task, config)
        result: dict[str, Any] = dict(train_model(model, data, spec, seed, flops_per_token=flops))
    else:
        fit, held = validation_split(data)
        whole = spec.model_copy(update={"eval_batches": None})  # the whole validation split
        search: dict[str, float | None] = {}
        best: tuple[float, float, nn.Module, dict[str, Any]] | None = None
        for lr in grid:
            torch.manual_seed(seed)
            candidate = task_model(data.task, config)
            trained = dict(train_model(candidate, fit, spec.model_copy(update={"lr": lr}), seed, flops_per_token=flops))
            loss = math.inf if "diverged_at_step" in trained else float(evaluate(candidate, held, whole)["eval_loss"])
            search[f"{lr:g}"] = loss if math.isfinite(loss) else None  # None: diverged (strict JSON)
            if best is None or loss < best[0]:  # ties: the first (smallest index) rate of the grid
                best = (loss, lr, candidate, trained)
        assert best is not None
        _, chosen, model, result = best
        result = {**result, "lr": chosen, "lr_search": search}
    if "diverged_at_step" not in result:  # a diverged model has nothing to evaluate
        result.update(evaluate(model, data, spec))
        if keep_weights:
            buffer = io.BytesIO()
            torch.save(model.state_dict(), buffer)
            result["weights"] = buffer.getvalue()
    return result


#: the share of the training rows a learning-rate search holds out to choose on
VALIDATION_FRACTION = 0.1


def validation_split(data: PreparedData) -> tuple[PreparedData, PreparedData]:
    """``(fit, validation)``: the training rows without their last :data:`VALIDATION_FRACTION` (at least one
    row), and those rows as the validation set (in the eval slots, so :func:`evaluate` scores them). The eval
    set is in neither."""
    held = max(1, round(len(data.train_ids) * VALIDATION_FRACTION))
    if len(data.train_ids) - held < 1:
        raise InputError(f"{len(data.train_ids)} training rows are too few to hold a validation split out")
    labels = data.train_labels
    fit = replace(
        data,
        train_ids=data.train_ids[:-held],
        train_mask=data.train_mask[:-held],
        train_labels=labels[:-held] if labels is not None else None,
    )
    validation = replace(
        data,
        eval_ids=data.train_ids[-held:],
        eval_mask=data.train_mask[-held:],
        eval_labels=labels[-held:] if labels is not None else None,
    )
    return fit, validation
