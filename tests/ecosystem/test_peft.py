"""PEFT LoRA on bertblocks models: query/value adapters train, save and load; merged equals unmerged; the packed
(unpadded) path runs the adapters too."""

from __future__ import annotations

import logging

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model

from bertblocks import BertForSequenceClassification, create_model
from tests.conftest import TINY, batch, max_diff
from tests.tolerances import assert_close


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("bertblocks").setLevel(logging.ERROR)


def _lora(**kwargs: object) -> LoraConfig:
    # init_lora_weights=False: random B, so the adapters change the outputs from the first step
    return LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False, **kwargs)


def test_lora_train_save_load_merge(tmp_path):
    torch.manual_seed(0)
    base = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, _lora(modules_to_save=["classifier"]))
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable
    assert all("lora_" in name or "classifier" in name for name in trainable)
    assert any(".query.lora_A" in name for name in trainable)
    assert any(".value.lora_B" in name for name in trainable)

    inputs = {**batch(), "labels": torch.tensor([0, 2, 1])}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    def eval_loss() -> float:
        model.eval()
        with torch.no_grad():
            return model(**inputs).loss.item()

    before = eval_loss()
    for _ in range(10):
        model.train()
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert eval_loss() < before

    model.eval()
    with torch.no_grad():
        trained = model(**inputs).logits
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    fresh = create_model(TINY, ["num_labels=3"], head="sequence_classification")
    fresh.load_state_dict(reference)
    loaded = PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert_close(loaded(**inputs).logits, trained)
        merged = loaded.merge_and_unload()
        assert type(merged) is BertForSequenceClassification
        assert not any("lora" in name for name, _ in merged.named_parameters())
        assert_close(merged(**inputs).logits, trained)


def test_lora_applies_on_the_packed_path():
    """A padded batch in inference packs real tokens (encoder.packing: always); LoRA layers still run."""
    torch.manual_seed(0)
    base = create_model(TINY, ["encoder.packing=always"]).eval()
    inputs = batch()
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        plain = base(**inputs).last_hidden_state
    base_state = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, _lora()).eval()
    calls = []
    for name, module in model.named_modules():
        if name.endswith("query.lora_A.default"):
            module.register_forward_hook(lambda m, i, o: calls.append(i[0].shape))
    with torch.no_grad():
        packed = model(**inputs).last_hidden_state
        with model.disable_adapter():
            assert_close(model(**inputs).last_hidden_state[mask], plain[mask])
    # the adapter saw the packed real tokens only, not the padded [b, s] grid
    assert calls
    assert all(shape[:-1].numel() == int(mask.sum()) for shape in calls)
    assert max_diff(packed[mask], plain[mask]) > 1e-3  # the adapters changed the outputs
    unpacked = create_model(TINY, ["encoder.packing=never"]).eval()
    unpacked.load_state_dict(base_state)
    reference = get_peft_model(unpacked, _lora())
    reference.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert_close(reference.eval()(**inputs).last_hidden_state[mask], packed[mask])
