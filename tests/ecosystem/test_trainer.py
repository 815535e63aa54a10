"""transformers' Trainer with bertblocks models, no user workaround: fine-tune (loss falls), evaluate with metrics,
gradient checkpointing through its flag, bf16, and save_model that bertblocks and transformers' Auto classes load."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import transformers
from transformers import TrainingArguments

from bertblocks import BertForMaskedLM, BertForSequenceClassification, create_model
from bertblocks.integrations.trainer import Trainer
from tests.conftest import TINY, batch
from tests.tolerances import assert_close


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


def _rows(n: int = 32, length: int = 8, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """A learnable toy task: the label is the first token's id modulo 3."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 99, (n, length), generator=g)
    mask = torch.ones(n, length, dtype=torch.long)
    return [{"input_ids": ids[i], "attention_mask": mask[i], "labels": ids[i, 0] % 3} for i in range(n)]


def _accuracy(prediction: transformers.EvalPrediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def _args(tmp_path: Path, **kwargs: object) -> TrainingArguments:
    defaults = {
        "output_dir": str(tmp_path / "run"),
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "num_train_epochs": 4,
        "learning_rate": 2e-3,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": 0,
    }
    return TrainingArguments(**{**defaults, **kwargs})


def _losses(trainer: transformers.Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize("trainer_class", [transformers.Trainer, Trainer])
def test_fine_tune_and_evaluate_with_metrics(tmp_path, trainer_class):
    """transformers' own Trainer trains and evaluates a bertblocks model as it is (num_items_in_batch,
    num_parameters(), outputs it can gather)."""
    torch.manual_seed(0)
    model = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    rows = _rows()
    trainer = trainer_class(
        model=model, args=_args(tmp_path), train_dataset=rows, eval_dataset=rows, compute_metrics=_accuracy
    )
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    losses = _losses(trainer)
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    assert after["eval_loss"] < before["eval_loss"]
    assert 0.0 <= after["eval_accuracy"] <= 1.0
    assert trainer.state.total_flos > 0  # floating_point_ops was called


def test_gradient_accumulation_with_a_model_that_ignores_num_items(tmp_path):
    torch.manual_seed(0)
    model = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    trainer = transformers.Trainer(
        model=model, args=_args(tmp_path, gradient_accumulation_steps=2, num_train_epochs=1), train_dataset=_rows()
    )
    assert trainer.model_accepts_loss_kwargs is False  # so the Trainer scales the loss for accumulation itself
    trainer.train()


def test_save_model_loads_in_bertblocks_and_transformers_auto(tmp_path):
    """With a `datasets.Dataset`: the Trainer drops the columns forward does not take (read from its signature)."""
    torch.manual_seed(0)
    model = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    rows = [{"input_ids": r["input_ids"].tolist(), "labels": int(r["labels"]), "text": "unused"} for r in _rows()]
    dataset = datasets.Dataset.from_list(rows)
    trainer = Trainer(model=model, args=_args(tmp_path, num_train_epochs=1), train_dataset=dataset)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "config.json").is_file()
    model.eval()
    inputs = batch()
    with torch.no_grad():
        want = model(**inputs).logits
        ours = BertForSequenceClassification.from_pretrained(tmp_path / "saved").eval()
        theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved").eval()
        assert_close(ours(**inputs).logits, want)
        assert_close(theirs(**inputs).logits, want)


def test_tied_masked_lm_checkpoints_and_save_model(tmp_path):
    """A tied masked LM: checkpoints during training and the final save write the shared tensor once."""
    torch.manual_seed(0)
    model = create_model(TINY, head="masked_lm")
    rows = [{"input_ids": r["input_ids"], "labels": r["input_ids"].clone()} for r in _rows(16)]
    args = _args(tmp_path, num_train_epochs=1, save_strategy="steps", save_steps=1, save_total_limit=1)
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    assert any((tmp_path / "run").glob("checkpoint-*/config.json"))
    trainer.save_model(str(tmp_path / "saved"))
    model.eval()
    ids = batch()["input_ids"]
    with torch.no_grad():
        theirs = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "saved").eval()
        ours = BertForMaskedLM.from_pretrained(tmp_path / "saved").eval()
        assert theirs.cls.predictions.decoder.weight is theirs.bert.embeddings.word_embeddings.weight
        assert ours.get_output_embeddings().weight is ours.get_input_embeddings().weight
        assert_close(theirs(input_ids=ids).logits, model(input_ids=ids).logits)
        assert_close(ours(input_ids=ids).logits, model(input_ids=ids).logits)


def test_gradient_checkpointing_flag_and_bf16(tmp_path):
    torch.manual_seed(0)
    model = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    args = _args(tmp_path, activation_checkpointing=True, bf16=True, num_train_epochs=2)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows())
    seen = []
    linear = next(m for m in model.bert.encoder.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    trainer.train()
    hook.remove()
    assert model.is_gradient_checkpointing
    assert torch.bfloat16 in seen  # CPU autocast: the matmuls ran in bf16
    losses = _losses(trainer)
    assert all(np.isfinite(losses))


@pytest.mark.parametrize(
    ("preset", "column", "wrap"),
    [("tiny-xmod", "lang_ids", "none"), ("tiny-layoutlm", "bbox", "none"), ("tiny-xmod", "lang_ids", "lora")],
)
def test_default_trainer_keeps_the_family_input_columns(tmp_path, preset, column, wrap):
    """transformers' Trainer drops the dataset columns its model's ``forward`` signature does not name (unless
    ``remove_unused_columns=False``): a family's own inputs, which the class's forward takes through ``**kwargs``,
    are listed in the model's ``forward`` signature from the backbone's one list, so the default Trainer keeps
    them, for a PEFT-wrapped model too (it reads the base model's signature); every step gets them."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = create_model(preset, ["num_labels=3"], head="sequence_classification")
    assert column not in inspect.signature(type(model).forward).parameters  # the class alone would drop it
    rows = [{k: v.tolist() for k, v in row.items()} for row in _rows(16)]
    for i, row in enumerate(rows):
        row[column] = i % 2 if column == "lang_ids" else [[i, i, i + 3, i + 5]] * len(row["input_ids"])
    dataset = datasets.Dataset.from_list(rows)
    seen: list[torch.Tensor | None] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs.get(column)), with_kwargs=True)
    if wrap == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["query", "value"]))
    trainer = transformers.Trainer(model=model, args=_args(tmp_path, num_train_epochs=1), train_dataset=dataset)
    assert trainer.args.remove_unused_columns  # the default
    trainer.train()
    assert len(seen) == 2  # 16 rows, batches of 8
    assert all(value is not None for value in seen)
    got, want = torch.cat([value.cpu() for value in seen]), torch.tensor([row[column] for row in rows])
    if column == "bbox":  # rows in the sampler's order: put back by their first x0 (the row number)
        got = got[got[:, 0, 0].argsort()]
    else:
        got, want = got.sort().values, want.sort().values
    assert torch.equal(got, want)  # every row's value, as the dataset holds it
