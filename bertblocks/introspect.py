"""Looking inside an assembled model: the module tree with parameter counts, the shapes of the tensors that
flow through one forward pass, and a Mermaid diagram.

These back the ``bertblocks build``, ``trace`` and ``diagram`` commands and are usable on their own.

Example:
    >>> model = bertblocks.create_model("examples/configs/minilm-relative-ablation.yaml")
    >>> print(format_tree(module_tree(model), count_parameters(model)))
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .config import BertConfig


# ----------------------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class ParameterCount:
    """Parameter totals of a model.

    Attributes:
        per_module: every module's parameters summed over the tree, as torchinfo prints its total: a tensor
            shared by two modules in different branches (the tied MLM decoder and the word embeddings) is
            counted in each.
        unique: distinct parameter tensors, each counted once (``sum(p.numel() for p in model.parameters())``).
        trainable: unique parameters with ``requires_grad``.
    """

    per_module: int
    unique: int
    trainable: int

    @property
    def shared(self) -> int:
        """Parameters counted more than once in :attr:`per_module` (tied weights)."""
        return self.per_module - self.unique


def _subtree_counts(model: nn.Module) -> dict[int, int]:
    """``id(module) → parameters counted in its subtree``.

    A module's count is its children's counts plus the tensors it holds directly that no descendant holds
    (HF's ``decoder.bias`` *is* ``predictions.bias``: counted once, inside ``decoder``). A tensor shared across
    branches is counted in each branch, which is what makes the per-module total exceed the unique one.
    """
    counts: dict[int, int] = {}

    def visit(module: nn.Module) -> int:
        if id(module) in counts:
            return counts[id(module)]
        below = {id(p) for child in module.children() for p in child.parameters()}
        own = {id(p): p.numel() for p in module.parameters(recurse=False) if id(p) not in below}
        total = sum(visit(child) for child in module.children()) + sum(own.values())
        counts[id(module)] = total
        return total

    visit(model)
    return counts


def count_parameters(model: nn.Module) -> ParameterCount:
    """Per-module (torchinfo) and unique parameter totals of ``model``."""
    unique = list(model.parameters())  # `parameters()` yields each tensor once
    return ParameterCount(
        per_module=_subtree_counts(model)[id(model)],
        unique=sum(p.numel() for p in unique),
        trainable=sum(p.numel() for p in unique if p.requires_grad),
    )


# ----------------------------------------------------------------------------------------------- tree
@dataclass(frozen=True)
class TreeRow:
    """One line of the module tree.

    Attributes:
        path: dotted module name (``encoder.layer.0``); for collapsed rows, the first one's.
        name: the name shown (``layer.0-11`` for twelve identical layers).
        type: class name, with the attention backend when the module has one (``BertAttention[sdpa]``).
        depth: nesting level, 0 for the model itself.
        params: parameters counted in this subtree (for collapsed rows: in each of the ``repeat`` modules).
        repeat: how many identical consecutive siblings this row stands for.
    """

    path: str
    name: str
    type: str
    depth: int
    params: int
    repeat: int = 1


def describe(module: nn.Module) -> str:
    """Class name, plus the attention kernel when the module has one (a kernel is not a submodule)."""
    backend = getattr(module, "backend", None)
    name = getattr(backend, "name", None)
    return f"{type(module).__name__}[{name}]" if isinstance(name, str) else type(module).__name__


def _signature(module: nn.Module) -> tuple[Any, ...]:
    """What makes two sibling modules "identical" for the tree: structure, kernels and parameter shapes."""
    return (
        tuple((name, describe(sub)) for name, sub in module.named_modules()),
        tuple((name, tuple(p.shape)) for name, p in module.named_parameters()),
    )


def module_tree(model: nn.Module, max_depth: int | None = None) -> list[TreeRow]:
    """The module tree, with identical consecutive siblings (the layers of a stack) collapsed into one row.

    Args:
        model: any module.
        max_depth: deepest level listed (0 = the model only); ``None`` lists every module.
    """
    counts = _subtree_counts(model)
    rows = [TreeRow("", type(model).__name__, describe(model), 0, counts[id(model)])]

    def walk(module: nn.Module, prefix: str, depth: int) -> None:
        children = list(module.named_children())
        i = 0
        while i < len(children):
            name, child = children[i]
            j = i + 1
            while j < len(children) and _signature(children[j][1]) == _signature(child):
                j += 1
            run = children[i:j]
            shown = name if len(run) == 1 else f"{name}-{run[-1][0]}"
            label = f"{prefix.rsplit('.', 1)[-1]}.{shown}" if isinstance(module, nn.ModuleList) else shown
            path = f"{prefix}.{name}" if prefix else name
            rows.append(TreeRow(path, label, describe(child), depth, counts[id(child)], len(run)))
            walk(child, path, depth + 1)
            i = j

    walk(model, "", 1)
    # A ModuleList adds a level without adding meaning: show `layer.0-11` directly under `encoder`.
    rows = _fold_module_lists(model, rows)
    return [row for row in rows if max_depth is None or row.depth <= max_depth]


def _fold_module_lists(model: nn.Module, rows: list[TreeRow]) -> list[TreeRow]:
    lists = {name for name, sub in model.named_modules() if isinstance(sub, nn.ModuleList)}
    out = []
    for row in rows:
        if row.path in lists:
            continue
        parent = row.path.rsplit(".", 1)[0] if "." in row.path else ""
        lifted = sum(1 for name in lists if parent == name or parent.startswith(f"{name}."))
        out.append(TreeRow(row.path, row.name, row.type, row.depth - lifted, row.params, row.repeat))
    return out


def format_tree(rows: Sequence[TreeRow], counts: ParameterCount, title: str = "") -> str:
    """A torchinfo-like table: the tree on the left, parameters per module on the right, totals below."""
    lines = []
    labels = []
    for row in rows:
        indent = "  " * row.depth
        repeat = f" ×{row.repeat}" if row.repeat > 1 else ""
        name = row.type if row.depth == 0 else f"{row.name}: {row.type}{repeat}"
        labels.append(f"{indent}{name}")
    width = max([len(label) for label in labels] + [40]) + 2
    rule = "=" * (width + 16)
    lines.append(rule)
    lines.append(f"{'Module (type)':<{width}}{'Param #':>16}")
    lines.append(rule)
    for label, row in zip(labels, rows, strict=True):
        each = f"{row.params:,}" + (" each" if row.repeat > 1 else "")
        lines.append(f"{label:<{width}}{each:>16}")
    lines.append(rule)
    lines.append(f"Total params (counted per module): {counts.per_module:,}")
    lines.append(f"Unique params: {counts.unique:,}" + (f" ({counts.shared:,} shared)" if counts.shared else ""))
    lines.append(f"Trainable params: {counts.trainable:,}")
    lines.append(rule)
    if title:
        lines.insert(0, title)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- trace
@dataclass(frozen=True)
class TraceStep:
    """One module call seen during a forward pass.

    Attributes:
        path: dotted module name.
        type: class name (with the attention kernel, see :func:`describe`).
        depth: nesting level among the traced calls (0 for the outermost).
        inputs: ``name → shape`` of the tensor arguments (positional ones named ``arg0``, …).
        outputs: ``name → shape`` of the tensors returned (``out``, or ``out0``, … / the output fields).
        note: what the shapes inside the module are, where a person studying BERT would want them
            (attention heads: ``Q, K, V [b, h, q, d]``).
    """

    path: str
    type: str
    depth: int
    inputs: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)
    note: str = ""


def _shapes(value: Any, name: str) -> Iterator[tuple[str, list[int]]]:
    if isinstance(value, torch.Tensor):
        yield name, list(value.shape)
    elif isinstance(value, Mapping) or callable(getattr(value, "items", None)):
        # model outputs are dataclasses that also behave like mappings (`out.last_hidden_state`, `out["..."]`)
        for key, item in value.items():
            yield from _shapes(item, str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _shapes(item, f"{name}{i}" if len(value) > 1 else name)


def _named_inputs(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, list[int]]:
    """Tensor arguments by parameter name (``hidden_states``, ``residual``), as the forward signature names them."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):  # builtins without a signature, or *args forwards
        bound = {f"arg{i}": a for i, a in enumerate(args)} | kwargs
    return dict(_shapes({k: v for k, v in bound.items() if v is not None}, ""))


def default_trace_depth(model: nn.Module) -> int:
    """Deep enough to show each layer's attention and feed-forward (``[bert.]encoder.layer.N.attention``)."""
    for name, module in model.named_modules():
        if hasattr(module, "encoder") and hasattr(module, "embeddings"):
            return 4 + (name.count(".") + 1 if name else 0)
    return 4


def trace(model: nn.Module, inputs: Mapping[str, Any], max_depth: int | None = None) -> list[TraceStep]:
    """Run ``model(**inputs)`` once without gradients and record every module call up to ``max_depth``.

    Steps are in call order (a parent is listed when it returns, after its children, so it is moved in front
    of them here). Containers that are never called (``ModuleList``) do not appear.
    """
    depth_limit = default_trace_depth(model) if max_depth is None else max_depth
    steps: dict[int, TraceStep] = {}
    order: list[int] = []
    handles = []
    counter = iter(range(1 << 30))

    def pre_hook(path: str) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            key = next(counter)
            order.append(key)
            # nesting = how many traced calls are open, so uncalled containers (ModuleList) add no indent
            steps[key] = TraceStep(path, describe(mod), len(stack), _named_inputs(mod, args, kwargs))
            stack.append(key)

        return hook

    def post_hook(path: str) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            key = stack.pop()
            step = steps[key]
            outputs = dict(_shapes(output, "out"))
            steps[key] = TraceStep(step.path, step.type, step.depth, step.inputs, outputs, _note(mod, step.inputs))

        return hook

    stack: list[int] = []
    for path, module in model.named_modules():
        depth = path.count(".") + 1 if path else 0
        if depth > depth_limit or isinstance(module, nn.ModuleList | nn.ModuleDict | nn.Dropout):
            continue
        handles.append(module.register_forward_pre_hook(pre_hook(path), with_kwargs=True))
        handles.append(module.register_forward_hook(post_hook(path), with_kwargs=True))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return [steps[key] for key in order]


def _note(module: nn.Module, inputs: Mapping[str, list[int]]) -> str:
    heads, head_dim = getattr(module, "num_heads", None), getattr(module, "head_dim", None)
    if not (isinstance(heads, int) and isinstance(head_dim, int)):
        return ""
    bias = getattr(getattr(module, "self", None), "position_bias", None)
    shape = next(iter(inputs.values()), None)
    if not shape or len(shape) != 3:
        return f"{heads} heads × {head_dim}"
    b, q = shape[0], shape[1]
    scores = f"scores [{b}, {heads}, {q}, {q}]"
    if bias is not None:
        scores += f" + {type(bias).__name__} [{b}, {heads}, {q}, {q}]"
    rotary = getattr(getattr(module, "self", None), "rotary", None)
    rotated = f" → rotate Q, K ({type(rotary).__name__})" if rotary is not None else ""
    return f"{heads} heads × {head_dim}: Q, K, V [{b}, {heads}, {q}, {head_dim}]{rotated} → {scores} → softmax · V"


def format_trace(steps: Sequence[TraceStep], tokens: Sequence[str] = ()) -> str:
    """One line per module call: indented name and type, input shapes → output shapes."""
    lines = []
    if tokens:
        lines.append(f"tokens ({len(tokens)}): {' '.join(tokens)}")
        lines.append("")
    base = 0
    for step in steps:
        ins = ", ".join(f"{k} {_fmt(v)}" for k, v in step.inputs.items()) or "-"
        outs = ", ".join(f"{k} {_fmt(v)}" for k, v in step.outputs.items()) or "-"
        name = step.path or "(model)"
        lines.append(f"{'  ' * (step.depth - base)}{name}: {step.type}  {ins} → {outs}")
        if step.note:
            lines.append(f"{'  ' * (step.depth - base + 1)}({step.note})")
    return "\n".join(lines)


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


# -------------------------------------------------------------------------------------------- diagram
def _layer_label(config: BertConfig, index: int) -> str:
    attention, feedforward = config.encoder.layer_specs(index)
    heads = attention.num_heads - len(set(config.pruned_heads.get(index, [])))
    pruned = f" ({len(config.pruned_heads[index])} pruned)" if config.pruned_heads.get(index) else ""
    attn_opts = "".join(f", {k}={v}" for k, v in sorted(attention.changed_options().items()))
    ff_opts = "".join(f", {k}={v}" for k, v in sorted(feedforward.changed_options().items()))
    backend_opts = "".join(f" {k}={v}" for k, v in sorted(attention.backend.changed_options().items()))
    kind = ""
    if config.is_decoder:
        kind = " · causal" + (" + cross-attention" if config.add_cross_attention else "")
    position = config.encoder.layer_position(index, config.position)
    # a layer whose position options an override changed (ModernBERT's global RoPE base) says so
    moved = (
        f"<br/>position: {position.name}" + "".join(f", {k}={v}" for k, v in sorted(position.changed_options().items()))
        if position != config.position
        else ""
    )
    label = (
        f"attention: {attention.name} · {attention.backend.name}{backend_opts} · {heads} heads{pruned}{attn_opts}"
        f"{kind}<br/>feedforward: {feedforward.name} · {feedforward.intermediate_size} · {feedforward.activation}"
        f"{ff_opts}{moved}"
    )
    layer, norm = config.encoder.layer_spec(index, "layer"), config.encoder.layer_spec(index, "norm")
    layer_opts, norm_opts = _changed_options(layer), _changed_options(norm)
    if layer.name != "post_ln" or norm.name != "layernorm" or layer_opts or norm_opts:
        label += f"<br/>layer: {layer.name}{layer_opts} · norm: {norm.name}{norm_opts}"
    return label


def _changed_options(spec: Any) -> str:
    """``, key=value`` for each plugin option of ``spec`` that differs from its plugin's default."""
    return "".join(f", {k}={v}" for k, v in sorted(spec.changed_options().items()))


def layer_groups(config: BertConfig) -> list[tuple[int, int, str]]:
    """``(first, last, label)`` for each run of consecutive layers with the same components and options."""
    groups: list[tuple[int, int, str]] = []
    for i in range(config.encoder.num_layers):
        label = _layer_label(config, i)
        if groups and groups[-1][2] == label:
            groups[-1] = (groups[-1][0], i, label)
        else:
            groups.append((i, i, label))
    return groups


def mermaid(config: BertConfig, counts: ParameterCount | None = None) -> str:
    """A Mermaid flowchart: inputs → embeddings → groups of identical layers → pooler → head.

    The token-type table and the ``token_type_ids`` input are drawn only where the model has the table
    (``type_vocab_size`` > 0). Layers changed by a per-layer override are marked, so an ablation's shape is
    visible at a glance.
    """
    overridden = {i for o in config.encoder.overrides for i in o.layers}
    h = config.hidden_size
    lines = ["flowchart TD"]
    # type_vocab_size 0 (DeBERTa-v3, GTE): no token-type table, and token_type_ids are ignored
    types = config.type_vocab_size > 0
    inputs = "input_ids, token_type_ids, attention_mask" if types else "input_ids, attention_mask"
    lines.append(f'    inputs["{inputs}<br/>[b, q]"]')
    pos = config.position.name
    emb = (
        f"embeddings: {config.embedding.name}<br/>word {config.vocab_size}×{h}"
        + (f" + type {config.type_vocab_size}×{h}" if types else "")
        + f"<br/>position: {pos}"
        + (f" {config.max_position_embeddings}×{h}" if pos == "absolute" else "")
        + "<br/>→ LayerNorm → dropout"
    )
    lines.append(f'    embeddings["{emb}"]')
    lines.append("    inputs --> embeddings")
    previous = "embeddings"
    for first, last, label in layer_groups(config):
        node = f"layers_{first}_{last}"
        span = f"layer {first}" if first == last else f"layers {first}–{last} (×{last - first + 1})"
        mark = " · override" if any(i in overridden for i in range(first, last + 1)) else ""
        lines.append(f'    {node}["{span}{mark}<br/>{label}"]')
        lines.append(f'    {previous} -->|"[b, q, {h}]"| {node}')
        if mark:
            lines.append(f"    class {node} override")
        previous = node
    lines.append(f'    out(["last_hidden_state [b, q, {h}]"])')
    lines.append(f"    {previous} --> out")
    if config.pooler is not None:
        lines.append(f'    pooler["pooler: {config.pooler.name}<br/>→ pooler_output [b, {h}]"]')
        lines.append(f"    {previous} --> pooler")
    if config.head is not None:
        lines.append(f'    head["head: {config.head.name}"]')
        lines.append(f"    {previous} --> head")
        if config.pooler is not None:
            lines.append("    pooler -.-> head")
    if counts is not None:
        lines.append(f'    params[/"{counts.unique:,} parameters"/]')
    lines.append("    classDef override fill:#fde68a,stroke:#b45309")
    return "\n".join(lines)
