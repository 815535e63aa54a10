"""Hugging Face BERT's weight initialisation, applied to every module of a built model (:func:`init_weights`) or
module by module while a model is materialised from the meta device (:func:`init_module`).

It lives with the models, not in ``core``: ``core`` holds interfaces, and the rule names concrete torch layers
(``nn.Linear``, ``nn.Embedding``, convolutions, norms) as transformers initialises them.
"""

from __future__ import annotations

import torch
from torch import nn


def init_weights(module: nn.Module, std: float) -> None:
    """HF BERT's initialisation of ``module`` and everything in it (see :func:`init_module`).

    A module whose parameters are all on the meta device (a model built there for a checkpoint to be loaded into)
    is left as it is: a draw on a meta tensor writes nothing, and each one dispatches through torch's Python
    reference kernels (about a third of a tiny model's ``from_pretrained``)."""
    params = list(module.parameters())
    if params and all(p.is_meta for p in params):
        return
    for sub in module.modules():
        init_module(sub, std)


@torch.no_grad()
def init_module(module: nn.Module, std: float) -> bool:
    """HF BERT's initialisation of one module's own parameters: normal(0, std) for linear and embedding
    weights, zero biases, unit LayerNorm; the padding row of an embedding with ``padding_idx`` starts at zero.
    Other modules may define ``reset_parameters_like_hf(std)`` (norms: weight 1, bias 0). A layer without a
    bias (``bias=False``) has none to initialise. The standard torch layers a plugin component may hold are
    covered as transformers' models initialise them: convolutions (``nn.Conv1d``/``2d``/``3d`` and transposed,
    as in ConvBERT) like ``nn.Linear``, the other norms (``nn.GroupNorm``, batch and instance norms) like
    ``nn.LayerNorm``; a subclass of one of them that defines ``reset_parameters_like_hf`` gets its own rule.
    Returns whether a rule covered the module (one without parameters of its own needs none)."""
    if isinstance(module, nn.Linear):
        module.weight.normal_(0.0, std)
        if module.bias is not None:
            module.bias.zero_()
    elif isinstance(module, nn.Embedding):
        module.weight.normal_(0.0, std)
        if module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm | nn.RMSNorm):
        if module.weight is not None:  # elementwise_affine=False has neither
            module.weight.fill_(1.0)
        if getattr(module, "bias", None) is not None:
            module.bias.zero_()
    elif hasattr(module, "reset_parameters_like_hf"):
        module.reset_parameters_like_hf(std)
    elif isinstance(module, nn.modules.conv._ConvNd):  # no public base class covers every convolution
        module.weight.normal_(0.0, std)
        if module.bias is not None:
            module.bias.zero_()
    elif isinstance(module, nn.GroupNorm | nn.modules.batchnorm._NormBase):  # batch and instance norms
        if module.weight is not None:  # affine=False has neither
            module.weight.fill_(1.0)
        if module.bias is not None:
            module.bias.zero_()
    else:
        return next(module.parameters(recurse=False), None) is None
    return True
