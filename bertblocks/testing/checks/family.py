"""Families: config.json and checkpoint keys translate both ways without loss."""

from __future__ import annotations

import torch

from ...registry import validate_config
from ...zoo import create_model
from ..assertions import expect
from ..subject import Subject


def check_family_round_trip(subject: Subject) -> None:
    """A family's config.json and checkpoint both ways: the config comes back equal, and a model's tensors go
    into the family's checkpoint keys and back unchanged (every key, every value)."""
    from ...families.keymap import BACKBONE_PREFIX, Shared
    from ...hf.config_json import config_from_hf, config_to_hf
    from ...hf.families import add_prefix, checkpoint_to_model, get_family, model_to_checkpoint

    config = validate_config(subject.config(), subject.registry)
    reg = subject.registry
    back = validate_config(config_from_hf(config_to_hf(config, reg), reg), reg)
    expect(back == config, "the config changed going through the family's config.json")
    model = create_model(config, registry=subject.registry)
    if any(isinstance(rule, Shared) for rule in get_family(subject.name, reg, source=None).key_map.rules):
        # the format stores one layer for all (ALBERT): give the model layers that agree, as a shared one would
        for layer in model.encoder.layer[1:]:
            layer.load_state_dict(model.encoder.layer[0].state_dict())
    state = add_prefix(model.state_dict(), BACKBONE_PREFIX)
    stored = model_to_checkpoint(state, config, registry=subject.registry)
    shapes = {k: v.shape for k, v in state.items()}
    again = checkpoint_to_model(stored, config, shapes, registry=subject.registry)
    expect(set(again) == set(state), f"keys changed in the key-map round trip: {sorted(set(again) ^ set(state))}")
    for key, tensor in state.items():
        expect(torch.equal(again[key], tensor), f"{key} changed in the key-map round trip")
