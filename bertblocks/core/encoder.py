"""The encoder skeleton: a stack of layers that calls the component interfaces and nothing concrete.

Module names mirror transformers' ``BertModel`` (``embeddings``, ``encoder.layer.N``, ``pooler``) so that
``state_dict()`` keys are HF's. The skeleton owns what must be done once per forward pass (input checks,
the additive mask, positions, head-mask expansion) so layers never redo it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import BertConfig
from .interfaces import Attention, Embedding, FeedForward, Pooler, Positions, PositionScheme
from .masks import additive_mask, check_attention_mask, is_all_visible
from .outputs import EncoderOutput, ModelOutputWithPooling


class TransformerLayer(nn.Module):
    """One post-LN layer: attention sub-layer, then feed-forward sub-layer (each with residual + LayerNorm)."""

    def __init__(self, attention: Attention, feedforward: FeedForward, chunk_size_feed_forward: int = 0) -> None:
        super().__init__()
        self.attention = attention
        # Registered as direct children, as HF does: keys `layer.N.intermediate.*` and `layer.N.output.*`.
        self.intermediate = feedforward.intermediate
        self.output = feedforward.output
        self.chunk_size_feed_forward = chunk_size_feed_forward

    def forward(
        self,
        hidden_states: torch.Tensor,  # [b, q, H]
        mask: torch.Tensor | None,  # additive [b, 1, 1|q, k]
        positions: Positions,
        head_mask: torch.Tensor | None = None,  # [h_original]
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attention(
            hidden_states,
            mask=mask,
            positions=positions,
            head_mask=head_mask,
            output_attentions=output_attentions,
        )
        chunk = self.chunk_size_feed_forward
        if chunk and attended.shape[1] > chunk:
            # HF's apply_chunking_to_forward: the block is position-wise, so splitting along the sequence is
            # exact and bounds the [b, chunk, intermediate] activation.
            pieces = [self._feedforward(part) for part in attended.split(chunk, dim=1)]
            return torch.cat(pieces, dim=1), weights
        return self._feedforward(attended), weights

    def _feedforward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.output(self.intermediate(hidden_states), hidden_states)


class Encoder(nn.Module):
    """The layer stack. ``gradient_checkpointing`` recomputes each layer in backward while training."""

    def __init__(self, layers: Sequence[TransformerLayer]) -> None:
        super().__init__()
        self.layer = nn.ModuleList(layers)  # singular name: HF's key is `encoder.layer.N`
        self.gradient_checkpointing = False

    def forward(
        self,
        hidden_states: torch.Tensor,
        mask: torch.Tensor | None,
        positions: Positions,
        head_mask: torch.Tensor | None = None,  # [layers, h_original]
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> EncoderOutput:
        all_hidden: list[torch.Tensor] = []
        all_attn: list[torch.Tensor] = []
        for i, layer in enumerate(self.layer):
            if output_hidden_states:
                all_hidden.append(hidden_states)
            layer_head_mask = None if head_mask is None else head_mask[i]
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden_states, weights = checkpoint(
                    layer,
                    hidden_states,
                    mask,
                    positions,
                    layer_head_mask,
                    output_attentions,
                    use_reentrant=False,
                )
            else:
                hidden_states, weights = layer(hidden_states, mask, positions, layer_head_mask, output_attentions)
            if output_attentions and weights is not None:
                all_attn.append(weights)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return EncoderOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attn) if output_attentions else None,
        )


class EncoderModel(nn.Module):
    """A BERT backbone with transformers' ``BertModel`` forward contract.

    Args:
        config: the validated config this model was built from (kept as ``model.config``).
        embeddings, encoder, pooler: the assembled components; ``pooler`` may be ``None``.
        position: the position scheme the components were built with (not a module; it made them).
    """

    def __init__(
        self,
        config: BertConfig,
        embeddings: Embedding,
        encoder: Encoder,
        pooler: Pooler | None,
        position: PositionScheme,
    ) -> None:
        super().__init__()
        self.config = config
        self.position_scheme = position
        self.embeddings = embeddings
        self.encoder = encoder
        self.pooler = pooler

    # ------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> ModelOutputWithPooling | tuple[torch.Tensor, ...]:
        """Encode a batch. Arguments and outputs are those of transformers' ``BertModel``.

        Args:
            input_ids: ``[b, q]`` token ids (or give ``inputs_embeds [b, q, H]`` instead).
            attention_mask: ``[b, k]`` or ``[b, q, k]``, 1 = attend, 0 = padding.
            token_type_ids: ``[b, q]`` segment ids; zeros when omitted.
            position_ids: ``[b|1, q]``; ``arange(q)`` when omitted.
            head_mask: ``[h]`` or ``[layers, h]`` multipliers of each head's attention probabilities.
            output_attentions: also return every layer's attention probabilities.
            output_hidden_states: also return the embeddings and every layer's output.
            return_dict: ``False`` returns a tuple of the non-``None`` fields instead.

        Raises:
            ValueError: for inputs of the wrong shape, dtype or range, each with what was expected.
        """
        embeds_in = self._check_inputs(input_ids, inputs_embeds, token_type_ids, position_ids)
        batch, length = embeds_in
        past_length = 0
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, past_length)
        dtype, device = hidden.dtype, hidden.device

        mask = None
        if attention_mask is not None:
            check_attention_mask(attention_mask, batch, length, past_length + length)
            if not is_all_visible(attention_mask):
                mask = additive_mask(attention_mask, dtype)
        positions = Positions.contiguous(length, past_length, device)
        layer_head_mask = self._expand_head_mask(head_mask, dtype)

        encoded = self.encoder(
            hidden,
            mask,
            positions,
            head_mask=layer_head_mask,
            output_attentions=bool(output_attentions),
            output_hidden_states=bool(output_hidden_states),
        )
        sequence = encoded.last_hidden_state
        pooled = self.pooler(sequence, attention_mask) if self.pooler is not None else None
        out = ModelOutputWithPooling(
            last_hidden_state=sequence,
            pooler_output=pooled,
            hidden_states=encoded.hidden_states,
            attentions=encoded.attentions,
        )
        return out if return_dict is None or return_dict else out.to_tuple()

    # --------------------------------------------------------------------------------------- input checks
    def _check_inputs(
        self,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
    ) -> tuple[int, int]:
        cfg = self.config
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        checking = not torch.compiler.is_compiling()  # data-dependent checks would break the graph
        if input_ids is not None:
            if input_ids.dim() != 2:
                raise ValueError(f"input_ids must be [batch, seq]; got shape {tuple(input_ids.shape)}")
            if input_ids.is_floating_point() or input_ids.dtype == torch.bool:
                raise ValueError(f"input_ids must be an integer tensor; got {input_ids.dtype}")
            if checking and input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= cfg.vocab_size):
                bad = input_ids[(input_ids < 0) | (input_ids >= cfg.vocab_size)]
                raise ValueError(
                    f"input_ids hold {bad[0].item()}, outside the vocabulary [0, {cfg.vocab_size}) of this model"
                )
            batch, length = input_ids.shape
        else:
            assert inputs_embeds is not None
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != cfg.hidden_size:
                raise ValueError(
                    f"inputs_embeds must be [batch, seq, {cfg.hidden_size}]; got {tuple(inputs_embeds.shape)}"
                )
            batch, length = inputs_embeds.shape[:2]
        if length > cfg.max_position_embeddings:
            raise ValueError(
                f"sequence length {length} exceeds max_position_embeddings={cfg.max_position_embeddings} "
                f"of this model; truncate the input (e.g. tokenizer max_length)"
            )
        if token_type_ids is not None:
            if tuple(token_type_ids.shape) != (batch, length):
                raise ValueError(
                    f"token_type_ids must have the input's shape {(batch, length)}; got {tuple(token_type_ids.shape)}"
                )
            if (
                checking
                and token_type_ids.numel()
                and (token_type_ids.min() < 0 or token_type_ids.max() >= cfg.type_vocab_size)
            ):
                raise ValueError(f"token_type_ids must lie in [0, {cfg.type_vocab_size}) (type_vocab_size)")
        if position_ids is not None:
            if position_ids.dim() != 2 or position_ids.shape[-1] != length or position_ids.shape[0] not in (1, batch):
                raise ValueError(f"position_ids must be [batch or 1, {length}]; got shape {tuple(position_ids.shape)}")
            if (
                checking
                and position_ids.numel()
                and (position_ids.min() < 0 or position_ids.max() >= cfg.max_position_embeddings)
            ):
                raise ValueError(
                    f"position_ids must lie in [0, {cfg.max_position_embeddings}) (max_position_embeddings)"
                )
        return batch, length

    def _expand_head_mask(self, head_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
        """``[h]`` or ``[layers, h]`` → ``[layers, h]`` in the model's dtype (HF's ``get_head_mask``)."""
        if head_mask is None:
            return None
        layers, heads = self.config.encoder.num_layers, self.config.encoder.attention.num_heads
        if head_mask.dim() == 1:
            head_mask = head_mask.unsqueeze(0).expand(layers, -1)
        if head_mask.dim() != 2 or tuple(head_mask.shape) != (layers, heads):
            raise ValueError(
                f"head_mask must be [num_heads] = [{heads}] or [num_layers, num_heads] = [{layers}, {heads}]; "
                f"got shape {tuple(head_mask.shape)}"
            )
        return head_mask.to(dtype)

    # ------------------------------------------------------------------------------------------- utilities
    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.input_embeddings()

    def prune_heads(self, heads_to_prune: dict[int, list[int]]) -> None:
        """Remove attention heads for good: ``{layer: [head, ...]}``, heads numbered as originally built.

        Recorded in ``config.pruned_heads`` so that a saved checkpoint (with its smaller tensors) rebuilds
        the same shapes before its weights are loaded.
        """
        merged = {int(k): list(v) for k, v in self.config.pruned_heads.items()}
        for layer, heads in heads_to_prune.items():
            self.encoder.layer[layer].attention.prune_heads(set(heads))
            merged[int(layer)] = sorted(set(merged.get(int(layer), [])) | set(heads))
        self.config.pruned_heads = merged

    def gradient_checkpointing_enable(self) -> None:
        """Recompute layer activations in backward instead of storing them (training only)."""
        self.encoder.gradient_checkpointing = True

    def gradient_checkpointing_disable(self) -> None:
        self.encoder.gradient_checkpointing = False


@torch.no_grad()
def init_weights(module: nn.Module, std: float) -> None:
    """HF BERT's initialisation: normal(0, std) for linear and embedding weights, zero biases, unit LayerNorm;
    the padding row of an embedding with ``padding_idx`` starts at zero."""
    for sub in module.modules():
        if isinstance(sub, nn.Linear):
            sub.weight.normal_(0.0, std)
            if sub.bias is not None:
                sub.bias.zero_()
        elif isinstance(sub, nn.Embedding):
            sub.weight.normal_(0.0, std)
            if sub.padding_idx is not None:
                sub.weight[sub.padding_idx].zero_()
        elif isinstance(sub, nn.LayerNorm):
            sub.weight.fill_(1.0)
            sub.bias.zero_()
        elif hasattr(sub, "reset_parameters_like_hf"):
            sub.reset_parameters_like_hf(std)
