"""Export: torch.export and ONNX (dynamo exporter, run in ONNX Runtime) equal eager on padded batches, with the
attention mask in the graph even when traced on an unpadded example; the ``bertblocks export`` command."""

from __future__ import annotations

import dataclasses
import logging
import types
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.utils._pytree as pytree

from bertblocks import BertForSequenceClassification, BertModel, cli, create_model
from bertblocks.core.interfaces import Attention, ExtraInput
from bertblocks.core.outputs import ModelOutputWithPooling, SequenceClassifierOutput
from bertblocks.errors import InputError
from bertblocks.models.export import example_inputs, export_onnx, export_program, model_inputs
from bertblocks.plugins.embeddings import BertEmbeddings
from bertblocks.registry import Registry
from tests.conftest import TINY, batch
from tests.tolerances import assert_close


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("bertblocks").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.onnx")
    warnings.filterwarnings("ignore", category=FutureWarning)


def _unpadded_example() -> dict[str, torch.Tensor]:
    """What a naive export traces with: nothing padded (the legacy exporter dropped the mask from such a trace)."""
    ids = torch.randint(1, 99, (2, 8), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}


def _real(x: torch.Tensor | np.ndarray, mask: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x)[mask.bool()]


def test_outputs_are_pytree_nodes():
    out = ModelOutputWithPooling(last_hidden_state=torch.ones(1), pooler_output=torch.zeros(1))
    leaves, spec = pytree.tree_flatten(out)
    assert [t.item() for t in leaves] == [1.0, 0.0]
    rebuilt = pytree.tree_unflatten([torch.full((1,), 5.0), torch.zeros(1)], spec)
    assert isinstance(rebuilt, ModelOutputWithPooling)
    assert rebuilt.last_hidden_state.item() == 5.0
    assert pytree.tree_flatten(SequenceClassifierOutput(logits=torch.ones(2)))[0][0].shape == (2,)


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification])
def test_torch_export_dynamic_batch_and_sequence(cls):
    torch.manual_seed(0)
    model = create_model(TINY, head=getattr(cls, "head_name", None)).eval()
    program = export_program(model, _unpadded_example())
    for b, length in ((3, 9), (5, 13), (2, 4)):
        inputs = batch(seed=b, b=b, length=length)
        assert not inputs["attention_mask"].all()
        with torch.no_grad():
            got, want = program.module()(**inputs), model(**inputs)
        assert type(got) is type(want)
        if cls is BertModel:
            mask = inputs["attention_mask"]
            assert_close(_real(got.last_hidden_state, mask), _real(want.last_hidden_state, mask))
            assert_close(got.pooler_output, want.pooler_output)
        else:
            assert_close(got.logits, want.logits)


@pytest.mark.parametrize(
    ("cls", "outputs"),
    [(BertModel, ["last_hidden_state", "pooler_output"]), (BertForSequenceClassification, ["logits"])],
)
def test_onnx_runtime_equals_pytorch_on_padded_batches(tmp_path, cls, outputs):
    torch.manual_seed(0)
    model = create_model(TINY, head=getattr(cls, "head_name", None)).eval()
    path = export_onnx(model, tmp_path / "model.onnx", example=_unpadded_example())
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in graph.output] == outputs
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input]
    assert all(isinstance(d[0], str) and isinstance(d[1], str) for d in dims)  # batch and sequence are symbolic
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for b, length in ((3, 9), (5, 13)):
        inputs = batch(seed=b, b=b, length=length)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        with torch.no_grad():
            want = model(**inputs)
        mask = inputs["attention_mask"]
        for name, value in zip(outputs, got, strict=True):
            expected = want[name]
            if name == "last_hidden_state":
                value, expected = _real(value, mask), _real(expected, mask)
            assert_close(torch.as_tensor(value), expected, what=name)


def test_export_refuses_models_it_cannot_export():
    decoder = create_model({**TINY, "is_decoder": True})
    with pytest.raises(ValueError, match="exporting a decoder"):
        export_program(decoder)


def test_export_command_writes_onnx_and_pt2(tmp_path, capsys):
    torch.manual_seed(0)
    model = create_model(TINY, head="masked_lm").eval()
    model.save_pretrained(tmp_path / "ckpt")
    code = cli.main(["export", str(tmp_path / "ckpt"), str(tmp_path / "model.pt2")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "exported BertForMaskedLM (torch.export;" in out
    program = torch.export.load(str(tmp_path / "model.pt2"))
    inputs = batch(seed=2, b=4, length=11)
    with torch.no_grad():
        got, want = program.module()(**inputs).logits, model(**inputs).logits
    mask = inputs["attention_mask"]
    assert_close(_real(got, mask), _real(want, mask))

    assert cli.main(["export", str(tmp_path / "ckpt"), str(tmp_path / "model.txt")]) == cli.EXIT_INVALID
    assert "the suffix must be one of .onnx, .pt2" in capsys.readouterr().err


# ------------------------------------------------------------------------ a family's own inputs (one door)
def _family_batch(model: torch.nn.Module, b: int, length: int) -> dict[str, torch.Tensor]:
    """A padded batch with every input the model takes; the family's own made unlike the tracing example (boxes of
    other sizes, other languages per row, another global token), so that a graph that ignored them would differ."""
    padded = batch(seed=b, b=b, length=length)  # its token types are 0 and 1: the example's zeros suit every family
    inputs = example_inputs(model, b, length)
    inputs["input_ids"], inputs["attention_mask"] = padded["input_ids"], padded["attention_mask"]
    g = torch.Generator().manual_seed(b)
    if "bbox" in inputs:
        corner = torch.randint(0, 60, (b, length, 2), generator=g)
        inputs["bbox"] = torch.cat([corner, corner + torch.randint(0, 60, (b, length, 2), generator=g)], -1)
    if "lang_ids" in inputs:
        inputs["lang_ids"] = torch.arange(b).flip(0) % 2
    if "global_attention_mask" in inputs:
        inputs["global_attention_mask"][0, 2] = 1
    return inputs


@pytest.mark.parametrize(
    ("preset", "extra", "axes"),
    [
        ("tiny-layoutlm", "bbox", ["batch", "sequence", 4]),
        ("tiny-xmod", "lang_ids", ["batch"]),
        ("tiny-longformer", "global_attention_mask", ["batch", "sequence"]),
    ],
)
def test_onnx_graph_takes_the_family_inputs(tmp_path, preset, extra, axes):
    """The exporter derives the graph's inputs from the backbone's one list of its inputs beyond BERT's, with their
    dtypes and dynamic axes; ONNX Runtime then equals PyTorch with those inputs given (and they matter)."""
    torch.manual_seed(0)
    model = create_model(preset).eval()
    assert model_inputs(model) == ("input_ids", "attention_mask", "token_type_ids", extra)
    path = export_onnx(model, tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graph = {i.name: i for i in session.get_inputs()}
    assert list(graph) == list(model_inputs(model))
    assert graph[extra].shape == axes
    assert graph[extra].type == "tensor(int64)"
    multiple = model.sequence_multiple  # Longformer's graph takes whole blocks of its one-sided window
    inputs = _family_batch(model, 3, -(-11 // multiple) * multiple)
    (hidden, pooled) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = model(**inputs)
        without = model(**{k: v for k, v in inputs.items() if k != extra})
    mask = inputs["attention_mask"]
    assert_close(_real(hidden, mask), _real(want.last_hidden_state, mask), what="last_hidden_state")
    assert_close(torch.as_tensor(pooled), want.pooler_output, what="pooler_output")
    assert not torch.allclose(want.pooler_output, without.pooler_output)  # the input changes the result


class _PagedEmbeddings(BertEmbeddings):
    """A third party's embedding with an input of its own, ``page_ids`` (per token, described by the default spec)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.page_embeddings = torch.nn.Embedding(4, self.word_embeddings.embedding_dim)
        self.extra_inputs = ("page_ids",)

    def forward(self, *args: object, page_ids: torch.Tensor | None = None, **kwargs: object) -> torch.Tensor:
        out = super().forward(*args, **kwargs)  # type: ignore[arg-type]
        return out if page_ids is None else out + self.page_embeddings(page_ids)


def _paged_registry(describe: bool = False) -> Registry:
    builtin = Registry(load_entry_points=False).get("embedding", "bert")

    def build(**kwargs: object) -> _PagedEmbeddings:
        module = _PagedEmbeddings(**kwargs)
        if describe:  # a wrong description: another name than the one declared
            module.extra_input_specs = lambda: (ExtraInput("pages"),)  # type: ignore[method-assign]
        return module

    paged = dataclasses.replace(builtin, name="paged", provider="", factory=build, aliases=())
    registry = Registry(load_entry_points=False)
    registry.register(types.SimpleNamespace(bertblocks_register_components=lambda: [paged]), name="paged-plugin")
    return registry


def test_a_plugin_input_is_exported_without_touching_the_exporter(tmp_path):
    """A component the exporter has never heard of declares an input: the graph takes it (the default spec, per
    token), and ONNX Runtime equals PyTorch on values other than the tracing example's."""
    torch.manual_seed(0)
    model = create_model({**TINY, "embedding": {"name": "paged"}}, registry=_paged_registry()).eval()
    assert model_inputs(model)[-1] == "page_ids"
    session = onnxruntime.InferenceSession(
        str(export_onnx(model, tmp_path / "model.onnx")), providers=["CPUExecutionProvider"]
    )
    assert [(i.name, i.shape) for i in session.get_inputs()][-1] == ("page_ids", ["batch", "sequence"])
    inputs = batch(seed=4, b=4, length=10)
    inputs["page_ids"] = torch.randint(0, 4, (4, 10), generator=torch.Generator().manual_seed(4))
    (_, pooled) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        want = model(**inputs).pooler_output
    assert_close(torch.as_tensor(pooled), want)
    program = export_program(model)  # torch.export: the input travels through the model's **extra_inputs
    with torch.no_grad():
        assert_close(program.module()(**inputs).pooler_output, want)


def test_a_component_describing_other_inputs_than_it_declares_is_refused():
    model = create_model({**TINY, "embedding": {"name": "paged"}}, registry=_paged_registry(describe=True))
    with pytest.raises(InputError, match=r"describes \['pages'\] but the module declares extra_inputs \['page_ids'\]"):
        model_inputs(model)


def test_an_axis_the_model_cannot_keep_dynamic_is_an_error_not_a_fixed_graph(tmp_path):
    """The ONNX exporter alone falls back to a graph fixed to the example's length when a dimension cannot stay
    dynamic; export_onnx runs torch.export first, so that is an error (here: a Longformer whose attention no longer
    declares that its graph takes whole blocks of its window)."""
    model = create_model("tiny-longformer").eval()
    for module in model.modules():
        if isinstance(module, Attention):
            module.sequence_multiple = 1
    with pytest.raises(RuntimeError, match=r"Constraints violated \(sequence\)"):
        export_onnx(model, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()
