"""What only X-MOD does, beyond its rows of tests/families/reference.py (which feed per-sequence ``lang_ids`` on every
shared path): every placement of the norms transformers supports (``pre_norm`` × the adapters' norm flags), a
pre-norm decoder's cross-attention, per-token ``lang_ids``, the default language and ``set_default_language``, a
packed task model, a chunked feed-forward, the checks of ``lang_ids`` (each a ``BertBlocksError`` naming it) and the
configurations the adapters refuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

import bertblocks
from bertblocks.config import ConfigError
from bertblocks.errors import BertBlocksError, InputError, InputTypeError, UnsupportedError
from tests.families.reference import FAMILIES, XMOD, batch, call_inputs, round_trip, save_hf
from tests.tolerances import assert_close

FAMILY = FAMILIES["xmod"]


def _loaded(tmp_path: Path, cls: str, *overrides: str, **extra: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    reference = save_hf(FAMILY, cls, tmp_path, **extra)
    return reference, bertblocks.from_pretrained(tmp_path, list(overrides), head="auto").eval()


def _real(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> None:
    assert_close(a[mask.bool()], b[mask.bool()])


def _per_token_languages(shape: tuple[int, ...]) -> torch.Tensor:
    """Languages changing inside each sequence (transformers indexes the hidden states with [b, q] ids alike)."""
    return torch.arange(shape[0] * shape[1]).reshape(shape) % len(XMOD["languages"])


#: every combination of XmodConfig's norm flags (beside an own adapter norm the reuse flag changes nothing, and is
#: still read back as written)
NORMS = [
    {"pre_norm": pre, "adapter_layer_norm": own, "adapter_reuse_layer_norm": reuse, "ln_before_adapter": before}
    for pre in (False, True)
    for own in (False, True)
    for reuse in (False, True)
    for before in (False, True)
]


@pytest.mark.parametrize("norms", NORMS, ids=lambda n: "-".join(f"{k}={int(v)}" for k, v in n.items()))
def test_every_placement_of_the_norms_equals_transformers_both_ways(tmp_path, norms):
    round_trip(tmp_path, FAMILY, "XmodForMaskedLM", **norms)


def test_a_pre_norm_decoder_cross_attends_as_transformers(tmp_path):
    """The cross-attention's LayerNorm moves before it too (``crossattention.output.LayerNorm``)."""
    reference, ours = _loaded(tmp_path, "XmodModel", pre_norm=True, is_decoder=True, add_cross_attention=True)
    assert "encoder.layer.0.crossattention_norm.weight" in ours.state_dict()
    inputs, mask = batch(FAMILY, "XmodModel")
    inputs = call_inputs("XmodModel", inputs)
    encoder = torch.randn(2, 3, XMOD["hidden_size"], generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = reference(**inputs, encoder_hidden_states=encoder).last_hidden_state
        _real(ours(**inputs, encoder_hidden_states=encoder).last_hidden_state, want, mask)
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.XmodModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        _real(again(**inputs, encoder_hidden_states=encoder).last_hidden_state, want, mask)


def test_a_pre_norm_model_states_its_layers_and_refuses_what_x_mod_cannot_say(tmp_path):
    """pre_norm: true is layer pre_ln with its defaults; a pre-LN stack X-MOD has no field for is not saved."""
    _, ours = _loaded(tmp_path, "XmodModel", pre_norm=True)
    assert ours.config.encoder.layer.name == "pre_ln"
    assert ours.encoder.final_norm is not None
    for override in ("encoder.layer.first_attention_norm", "encoder.layer.final_norm"):
        changed = bertblocks.create_model(ours.config, {override: False})
        with pytest.raises(BertBlocksError, match="pre_norm=True normalises every layer's attention input"):
            changed.save_pretrained(tmp_path / "refused")
        assert not (tmp_path / "refused").exists()


def test_languages_change_the_numbers_and_omitted_ones_are_the_default_as_in_transformers(tmp_path):
    reference, ours = _loaded(tmp_path, "XmodModel")
    inputs, mask = batch(FAMILY, "XmodModel")
    inputs = call_inputs("XmodModel", inputs)
    without = {k: v for k, v in inputs.items() if k != "lang_ids"}
    default = XMOD["languages"].index(XMOD["default_language"])
    with torch.no_grad():
        chosen, plain = ours(**inputs).last_hidden_state, ours(**without).last_hidden_state
        _real(plain, reference(**without).last_hidden_state, mask)
        explicit = ours(**without, lang_ids=torch.full((2,), default)).last_hidden_state
    assert_close(explicit, plain)
    assert (chosen - plain)[1].abs().max() > 1e-3  # row 1 is not in the default language


def test_per_token_languages_equal_transformers(tmp_path):
    reference, ours = _loaded(tmp_path, "XmodForTokenClassification")
    inputs, mask = batch(FAMILY, "XmodForTokenClassification")
    inputs["lang_ids"] = _per_token_languages(tuple(inputs["input_ids"].shape))
    with torch.no_grad():
        want, got = reference(**inputs), ours(**inputs)
    _real(got.logits, want.logits, mask)
    assert_close(got.loss, want.loss)


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("packing", ["never", "always"])
def test_a_task_model_carries_languages_into_the_packed_backbone(tmp_path, packing, pre_norm):
    reference, ours = _loaded(tmp_path, "XmodForTokenClassification", f"encoder.packing={packing}", pre_norm=pre_norm)
    inputs, mask = batch(FAMILY, "XmodForTokenClassification")
    inputs["lang_ids"] = _per_token_languages(tuple(inputs["input_ids"].shape))
    with torch.no_grad():
        want, got = reference(**inputs), ours(**inputs, output_hidden_states=True)
    _real(got.logits, want.logits, mask)
    if packing == "always":  # really packed: padded positions of the hidden states hold zeros
        assert got.hidden_states[-1][mask == 0].abs().max() == 0


@pytest.mark.parametrize("pre_norm", [False, True])
def test_a_chunked_feed_forward_chunks_the_languages_with_the_tokens(tmp_path, pre_norm):
    """Pre-norm, the un-normalised residual the adapters' output adds is chunked with the normalised input."""
    reference, ours = _loaded(tmp_path, "XmodModel", chunk_size_feed_forward=3, pre_norm=pre_norm)
    assert ours.config.chunk_size_feed_forward == 3
    inputs, mask = batch(FAMILY, "XmodModel")
    inputs = call_inputs("XmodModel", inputs)
    inputs["lang_ids"] = _per_token_languages(tuple(inputs["input_ids"].shape))
    with torch.no_grad():
        _real(ours(**inputs).last_hidden_state, reference(**inputs).last_hidden_state, mask)


def test_without_a_default_language_lang_ids_are_required_until_one_is_set(tmp_path):
    reference, ours = _loaded(tmp_path, "XmodModel", default_language=None)
    inputs, mask = batch(FAMILY, "XmodModel")
    without = {k: v for k, v in call_inputs("XmodModel", inputs).items() if k != "lang_ids"}
    with pytest.raises(InputError, match=r"pass lang_ids .*or call model.set_default_language"):
        ours(**without)
    with pytest.raises(InputError, match="no adapter for 'xx_XX'; its languages are"):
        ours.set_default_language("xx_XX")
    ours.set_default_language("fr_XX")
    reference.set_default_language("fr_XX")
    with torch.no_grad():
        _real(ours(**without).last_hidden_state, reference(**without).last_hidden_state, mask)
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["default_language"] == "fr_XX"
    assert transformers.XmodModel.from_pretrained(tmp_path / "ours").config.default_language == "fr_XX"
    with pytest.raises(UnsupportedError, match="no language adapters"):
        bertblocks.create_model("tiny-bert").set_default_language("en_XX")


# ------------------------------------------------------------------------------------------------ bad lang_ids
BAD_LANGUAGES = [
    (lambda: torch.tensor([0.0, 1.0]), InputTypeError, "lang_ids must be an integer tensor.*torch.float32"),
    (lambda: torch.tensor([0, 1, 2]), InputError, r"lang_ids must be \[batch\] = \(2,\).*got shape \(3,\)"),
    (lambda: torch.zeros(2, 4, dtype=torch.long), InputError, r"\[batch, seq\] = \(2, 5\).*got shape \(2, 4\)"),
    (lambda: torch.tensor([0, 2]), InputError, r"lang_ids hold 2, not the index of one of the 2 languages"),
    (lambda: torch.tensor([-1, 0]), InputError, "lang_ids hold -1"),
    (lambda: [0, 1], InputTypeError, "lang_ids must be a tensor"),
]


@pytest.mark.parametrize(("make", "error", "message"), BAD_LANGUAGES)
def test_bad_lang_ids_are_refused_naming_them(make, error, message):
    model = bertblocks.create_model("tiny-xmod").eval()
    with pytest.raises(error, match=message) as caught:
        model(input_ids=torch.randint(3, 99, (2, 5)), lang_ids=make())
    assert isinstance(caught.value, BertBlocksError)


def test_adapters_outside_a_post_ln_or_pre_ln_layer_or_without_a_bottleneck_are_refused():
    with pytest.raises(ConfigError, match=r"adapters feed-forward needs layer post_ln .* or pre_ln"):
        bertblocks.create_model("tiny-xmod", {"encoder.layer.name": "parallel"})
    with pytest.raises(ConfigError, match=r"adapters feed-forward needs .* norm layernorm"):
        bertblocks.create_model("tiny-xmod", {"encoder.norm.name": "rmsnorm"})
    with pytest.raises(ConfigError, match="reduction_factor: 64 leaves the adapters no bottleneck"):
        bertblocks.create_model("tiny-xmod", {"encoder.feedforward.reduction_factor": 64})


def test_a_model_of_one_language_needs_no_lang_ids(tmp_path):
    """transformers refuses such a call without default_language; with one adapter there is nothing to choose."""
    reference, ours = _loaded(tmp_path, "XmodModel", languages=["sw_KE"], default_language=None)
    inputs, mask = batch(FAMILY, "XmodModel")
    without = {k: v for k, v in call_inputs("XmodModel", inputs).items() if k != "lang_ids"}
    with torch.no_grad():
        want = reference(**without, lang_ids=torch.zeros(2, dtype=torch.long)).last_hidden_state
        _real(ours(**without).last_hidden_state, want, mask)
