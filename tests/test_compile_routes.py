"""Packing under every way of compiling a model: ``torch.compile(model)``, ``model.compile()``, and transformers'
``Trainer`` with ``TrainingArguments(torch_compile=True)`` (bertblocks' subclass and transformers' own).

For each route, across ten batches of ten different padded lengths: the graph packs (the packing op is in it, or
ran once per step), one graph serves every length (counted: no recompilation), outputs and gradients equal the
eager model's within the tolerance policy, and no compiler setting of the process has changed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
import torch._inductor.config
import transformers
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters

import bertblocks
from bertblocks.integrations.trainer import Trainer
from tests.conftest import TINY, to_device
from tests.tolerances import assert_close, assert_grads_close

LENGTHS = range(5, 15)  # ten padded lengths
PACK_OP = "bertblocks::real_token_index"


@pytest.fixture(autouse=True)
def _fresh_compiler():
    """A clean compile cache and counters per test; and the process's compiler settings, which must come out of
    every route as they went in."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch._dynamo.reset()
    counters.clear()
    before = (torch._dynamo.config.get_config_copy(), torch._inductor.config.get_config_copy())
    yield
    assert (torch._dynamo.config.get_config_copy(), torch._inductor.config.get_config_copy()) == before
    torch._dynamo.reset()


class CountingBackend:
    """``aot_eager`` (forward and backward graphs, eager kernels), counting the graphs dynamo compiles and those
    that pack (hold the packing op)."""

    def __init__(self) -> None:
        self.graphs = 0
        self.packing_graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs += 1
        pack = (torch.ops.bertblocks.real_token_index, torch.ops.bertblocks.real_token_index.default)
        self.packing_graphs += any(node.target in pack for node in gm.graph.nodes)
        return aot_eager(gm, example_inputs)


def _model() -> torch.nn.Module:
    """A tiny classifier that packs in training; no dropout, so compiled and eager gradients compare."""
    torch.manual_seed(0)
    overrides = {"encoder.packing": "always", "hidden_dropout_prob": 0.0, "encoder.attention.dropout": 0.0}
    # problem_type set here; a classifier without one is tested below (it is recorded before the graph)
    config = {**TINY, "initializer_range": 0.2, "num_labels": 2, "problem_type": "single_label_classification"}
    return bertblocks.create_model(config, overrides, head="sequence_classification").train()


def _batch(length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows right-padded to ``length``: the first full, the others shorter (at least one token)."""
    g = torch.Generator().manual_seed(seed + length)
    lengths = torch.randint(1, length, (3,), generator=g)
    lengths[0] = length
    return {
        "input_ids": torch.randint(1, TINY["vocab_size"], (3, length), generator=g),
        "attention_mask": (torch.arange(length)[None, :] < lengths[:, None]).long(),
        "labels": torch.randint(0, 2, (3,), generator=g),
    }


def _step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss and gradients of one training step (by the model's parameter names, also through torch.compile's
    wrapper)."""
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()
    grads = {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def _assert_step_equal(actual: tuple, expected: tuple, length: int) -> None:
    assert_grads_close(actual[0], expected[0], what=f"loss at length {length}")
    assert actual[1].keys() == expected[1].keys()
    for name, grad in expected[1].items():
        assert_grads_close(actual[1][name], grad, what=f"{name}.grad at length {length}")


def _compile(route: str, model: torch.nn.Module, backend: CountingBackend) -> torch.nn.Module:
    if route == "torch.compile(model)":
        return torch.compile(model, backend=backend)
    model.compile(backend=backend)
    return model


@pytest.mark.compile
@pytest.mark.parametrize("route", ["torch.compile(model)", "model.compile()"])
def test_route_packs_trains_and_evaluates_in_one_graph_across_ten_lengths(route, device):
    model = _model().to(device)
    reference = _model().to(device)  # eager, the same weights (the same seed)
    backend = CountingBackend()
    compiled = _compile(route, model, backend)
    for length in LENGTHS:
        inputs = to_device(_batch(length), device)
        _assert_step_equal(_step(compiled, inputs), _step(reference, inputs), length)
    # the default (dynamic=None) would compile a static graph for the first length, then a second one
    assert backend.graphs == 1, f"{backend.graphs} graphs for ten lengths in training"
    assert backend.packing_graphs == 1

    model.eval()
    reference.eval()
    with torch.no_grad():
        for length in LENGTHS:
            inputs = to_device(_batch(length, seed=1), device)
            real = inputs["attention_mask"].bool()
            out = compiled(**inputs, output_hidden_states=True)
            expected = reference(**inputs, output_hidden_states=True)
            assert_close(out.logits, expected.logits)
            assert_close(out.hidden_states[-1][real], expected.hidden_states[-1][real])
            assert (out.hidden_states[-1][~real] == 0).all()  # packed: padded positions are zeros
    # evaluation (no grad, eval mode) is one more graph, for every length
    assert backend.graphs == 2, f"{backend.graphs - 1} graphs for ten lengths in evaluation"
    assert backend.packing_graphs == 2


@pytest.mark.compile
def test_model_called_from_a_compiled_wrapper_packs_without_a_graph_break():
    """Traced from a user's graph, the model's call marks nothing and breaks nothing (fullgraph=True holds)."""

    class Wrapper(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **inputs: torch.Tensor) -> torch.Tensor:
            return self.inner(**inputs).loss

    model = _model()
    reference = _model()
    backend = CountingBackend()
    compiled = torch.compile(Wrapper(model), backend=backend, fullgraph=True)
    inputs = _batch(9)
    assert_grads_close(compiled(**inputs), reference(**inputs).loss)
    assert backend.packing_graphs == backend.graphs == 1


def _unset_problem_type_model(num_labels: int) -> torch.nn.Module:
    """A tiny classifier as :func:`_model`'s, but with no ``problem_type``: the first call with labels infers it."""
    torch.manual_seed(0)
    overrides = {"encoder.packing": "always", "hidden_dropout_prob": 0.0, "encoder.attention.dropout": 0.0}
    config = {**TINY, "initializer_range": 0.2, "num_labels": num_labels}
    return bertblocks.create_model(config, overrides, head="sequence_classification").train()


# transformers' rule: one label → regression; integer labels → single-label; else multi-label
PROBLEMS = {
    "single_label_classification": (2, lambda g: torch.randint(0, 2, (3,), generator=g)),
    "regression": (1, lambda g: torch.randn(3, generator=g)),
    "multi_label_classification": (2, lambda g: torch.randint(0, 2, (3, 2), generator=g).float()),
}


@pytest.mark.compile
@pytest.mark.parametrize("route", ["torch.compile(model)", "model.compile()"])
@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_unset_problem_type_is_recorded_without_a_graph_break_or_a_recompile(route, problem):
    """The inferred ``problem_type`` reaches the config before the compiled graph: one graph for ten lengths, no
    graph break, the eager model's losses and gradients, and the config records what transformers would."""
    num_labels, make_labels = PROBLEMS[problem]
    model = _unset_problem_type_model(num_labels)
    reference = _unset_problem_type_model(num_labels)  # eager, the same weights
    assert model.config.problem_type is None
    backend = CountingBackend()
    compiled = _compile(route, model, backend)
    for length in LENGTHS:
        inputs = {**_batch(length), "labels": make_labels(torch.Generator().manual_seed(length))}
        _assert_step_equal(_step(compiled, inputs), _step(reference, inputs), length)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert backend.graphs == 1, f"{backend.graphs} graphs for ten lengths"
    assert model.config.problem_type == reference.config.problem_type == problem


@pytest.mark.compile
def test_unset_problem_type_given_positionally_is_recorded_before_the_graph():
    """``labels`` passed by position (forward's order) is found as well: one graph, the type recorded."""
    model = _unset_problem_type_model(2)
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend)
    for length in (5, 9):
        inputs = _batch(length)
        compiled(inputs["input_ids"], inputs["attention_mask"], None, None, None, None, inputs["labels"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert backend.graphs == 1
    assert model.config.problem_type == "single_label_classification"


def _marks(inputs: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {k: tuple(sorted(getattr(t, "_dynamo_weak_dynamic_indices", ()))) for k, t in inputs.items()}


@pytest.mark.compile
def test_calls_leave_the_callers_tensors_as_they_came():
    """Dimensions are marked dynamic on the way into a compiled graph and unmarked on the way out: the same tensors
    given to another compiled function then find it without a mark it was not compiled with (which recompiled
    it). An eager call marks nothing; a tensor the caller marked keeps its marks."""
    inputs = _batch(7)
    model = _model()
    model(**inputs)
    assert _marks(inputs) == dict.fromkeys(inputs, ())
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend)
    elsewhere = torch.compile(lambda input_ids, attention_mask, labels: input_ids * attention_mask, backend=backend)
    elsewhere(**inputs)
    compiled(**inputs)
    assert _marks(inputs) == dict.fromkeys(inputs, ())
    elsewhere(**inputs)
    assert backend.graphs == 2  # one each: `elsewhere` did not recompile
    torch._dynamo.maybe_mark_dynamic(inputs["labels"], 0)
    compiled(**{**inputs, "labels": inputs["labels"]})
    assert _marks(inputs) == {**dict.fromkeys(inputs, ()), "labels": (0,)}


# ----------------------------------------------------------------------------------------------------- Trainer
def _rows() -> list[dict[str, torch.Tensor]]:
    """Ten batches of two rows, batch k padded to length LENGTHS[k] (rows in order: see _recording)."""
    rows = []
    for length in LENGTHS:
        inputs = _batch(length)
        for i in range(2):
            n = int(inputs["attention_mask"][i].sum())
            rows.append({"input_ids": inputs["input_ids"][i, :n], "labels": inputs["labels"][i]})
    return rows


def _collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad to the batch's longest row, as transformers' DataCollatorWithPadding does."""
    length = max(len(row["input_ids"]) for row in rows)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row["input_ids"])] = row["input_ids"]
        mask[i, : len(row["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([row["labels"] for row in rows])}


def _recording(base: type[transformers.Trainer]) -> type[transformers.Trainer]:
    """``base`` that takes the rows in order and records each step's padded length, loss and gradients, and how
    many times the packing op ran in the step (the compiled graph's; eager packing calls ``nonzero`` itself)."""

    class Recording(base):  # type: ignore[misc, valid-type]
        steps: list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]]
        packing_calls: list[int]

        def _get_train_sampler(self, train_dataset: Any = None) -> torch.utils.data.Sampler:
            rows = train_dataset if train_dataset is not None else self.train_dataset
            return torch.utils.data.SequentialSampler(rows)

        def training_step(self, model: torch.nn.Module, inputs: dict[str, Any], *args: Any, **kwargs: Any):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                loss = super().training_step(model, inputs, *args, **kwargs)
            calls = sum(event.count for event in profile.key_averages() if event.key == PACK_OP)
            grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}
            self.steps = [*getattr(self, "steps", []), (inputs["input_ids"].shape[1], loss.detach(), grads)]
            self.packing_calls = [*getattr(self, "packing_calls", []), calls]
            return loss

    return Recording


def _train(
    base: type[transformers.Trainer], tmp_path: Path, compile: bool, make_model: Any = None
) -> transformers.Trainer:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        num_train_epochs=1,
        learning_rate=0.0,  # the weights stay put: every step's gradients compare with the eager run's
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
        seed=0,
        torch_compile=compile,
        **({"torch_compile_backend": "aot_eager"} if compile else {}),
    )
    model = make_model() if make_model is not None else _model()
    trainer = _recording(base)(model=model, args=args, train_dataset=_rows(), data_collator=_collate)
    trainer.train()
    return trainer


@pytest.mark.compile
@pytest.mark.parametrize("base", [Trainer, transformers.Trainer], ids=["bertblocks.Trainer", "transformers.Trainer"])
def test_trainer_with_torch_compile_packs_in_one_graph_with_eager_gradients(base, tmp_path):
    eager = _train(base, tmp_path / "eager", compile=False)
    assert counters["stats"]["unique_graphs"] == 0
    assert eager.packing_calls == [0] * len(LENGTHS)
    compiled = _train(base, tmp_path / "compiled", compile=True)
    assert isinstance(compiled.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)  # accelerate compiled it
    assert [s[0] for s in compiled.steps] == list(LENGTHS)
    assert counters["stats"]["unique_graphs"] == 1  # ten lengths, one graph: no recompilation
    # the compiled graph's packing op ran once in every step after the first (which also traced it)
    assert compiled.packing_calls[0] >= 1
    assert compiled.packing_calls[1:] == [1] * (len(LENGTHS) - 1)
    for (length, *actual), (_, *expected) in zip(compiled.steps, eager.steps, strict=True):
        _assert_step_equal(actual, expected, length)


@pytest.mark.compile
def test_trainer_with_torch_compile_records_an_unset_problem_type_in_one_graph(tmp_path):
    """``Trainer(torch_compile=True)`` on a classifier with no ``problem_type``: one graph for ten lengths, no graph
    break, the eager run's gradients, and the config records transformers' inferred type."""
    model = lambda: _unset_problem_type_model(2)  # noqa: E731
    eager = _train(transformers.Trainer, tmp_path / "eager", compile=False, make_model=model)
    assert eager.model.config.problem_type == "single_label_classification"
    compiled = _train(transformers.Trainer, tmp_path / "compiled", compile=True, make_model=model)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert compiled.model.config.problem_type == "single_label_classification"
    for (length, *actual), (_, *expected) in zip(compiled.steps, eager.steps, strict=True):
        _assert_step_equal(actual, expected, length)
