"""transformers' ``Trainer``, saving bertblocks models as transformers saves its own.

transformers' ``Trainer`` trains, evaluates and checkpoints a bertblocks model as it is (the model has the
surface it calls: ``num_items_in_batch``, ``num_parameters()``, gradient checkpointing, outputs it can
gather). One thing it cannot do: its ``save_model`` calls ``save_pretrained`` only on instances of
transformers' ``PreTrainedModel`` (or PEFT's ``PeftModel``); any other module gets a bare
``model.safetensors`` of ``state_dict()``, without ``config.json`` and failing on tied weights ("Some tensors
share memory"). :class:`Trainer` here is transformers' class with that one method changed, so that
``save_model`` and every checkpoint write what :meth:`bertblocks.BertModel.save_pretrained` writes: loadable
by bertblocks and by transformers' Auto classes.

``TrainingArguments(torch_compile=True)`` needs nothing from this class: accelerate calls ``torch.compile(model)``,
and a bertblocks model keeps packing in that graph, one graph for every padded length, with no compiler setting
(:mod:`bertblocks.models.compiling`, docs/explanation/packing.md).

Example:
    >>> from bertblocks.integrations.trainer import Trainer          # instead of `from transformers import Trainer`
    >>> trainer = Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
    >>> trainer.train(); trainer.save_model("out")      # out/config.json + out/model.safetensors
"""

from __future__ import annotations

import os

import torch
import transformers

from ..atomic import write_file
from ..models.surface import PretrainedSurface

#: the file transformers' Trainer writes its ``TrainingArguments`` to, next to the model
TRAINING_ARGS_NAME = "training_args.bin"


class Trainer(transformers.Trainer):
    """transformers' ``Trainer`` whose ``save_model`` writes ``config.json`` and weights for bertblocks models."""

    def _save(self, output_dir: str | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        if not isinstance(model, PretrainedSurface):  # a PEFT model, or anything else: transformers' own way
            super()._save(output_dir, state_dict)
            return
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if not self.args.should_save:
            return
        os.makedirs(output_dir, exist_ok=True)
        model.save_pretrained(output_dir, state_dict=state_dict)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(output_dir)
        path = os.path.join(output_dir, TRAINING_ARGS_NAME)
        write_file(path, lambda f: torch.save(self.args, f))


__all__ = ["Trainer"]
