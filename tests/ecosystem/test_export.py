"""Export: torch.export and ONNX (dynamo exporter, run in ONNX Runtime) equal eager on padded batches, with the
attention mask in the graph even when traced on an unpadded example; the ``bertblocks export`` command."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import torch.utils._pytree as pytree

from bertblocks import BertForSequenceClassification, BertModel, cli, create_model
from bertblocks.core.outputs import ModelOutputWithPooling, SequenceClassifierOutput
from bertblocks.models.export import export_onnx, export_program
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
