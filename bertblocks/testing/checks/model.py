"""Checks every component kind gets, in a tiny model (a task model for a head): shapes and dtypes, padding,
batch independence, determinism, gradients, the checkpoint round trip and ``torch.compile``."""

from __future__ import annotations

import tempfile

import torch

from ..assertions import close, close_outputs, expect, float_outputs
from ..inputs import infer, model_inputs
from ..subject import TINY_CONFIG, ConformanceSkip, Subject


def check_shapes_and_dtypes(subject: Subject) -> None:
    """Outputs have BERT's shapes (leading dimensions those of the input), follow the model's dtype (float32
    and float64) and are finite."""
    hidden = TINY_CONFIG["hidden_size"]
    layers = TINY_CONFIG["encoder"]["num_layers"]
    for dtype in (torch.float32, torch.float64):
        model = subject.model().to(dtype)
        inputs = model_inputs(model)
        lead = tuple(inputs["attention_mask"].shape[:-1])
        b, q = inputs["input_ids"].shape[-2:]
        out = infer(model, **inputs, output_hidden_states=True)
        outputs = float_outputs(out)
        expect(bool(outputs), f"the output has no floating-point tensors: {list(out.keys())}")
        for name, value in outputs.items():
            expect(tuple(value.shape[: len(lead)]) == lead, f"{name} is {tuple(value.shape)}; must start with {lead}")
            expect(value.dtype == dtype, f"a {dtype} model returned a {value.dtype} {name}")
            expect(bool(torch.isfinite(value).all()), f"non-finite values in {name} ({dtype})")
        expect(len(out.hidden_states) == layers + 1, "hidden_states must hold the embeddings and every layer")
        if subject.kind == "head":
            continue
        seq = out.last_hidden_state
        expect(tuple(seq.shape) == (b, q, hidden), f"last_hidden_state is {tuple(seq.shape)}, not {(b, q, hidden)}")
        if out.pooler_output is not None:
            pooled = out.pooler_output
            expect(tuple(pooled.shape) == (b, hidden), f"pooler_output is {tuple(pooled.shape)}, not {(b, hidden)}")


def check_padding_mask(subject: Subject) -> None:
    """Changing the tokens at padded positions changes no output at real positions (nor pooled ones)."""
    model = subject.model()
    if getattr(getattr(model, "head", None), "pools_padded_positions", False):
        raise ConformanceSkip("the head declares pools_padded_positions: its pooled output reads a padded position")
    inputs = model_inputs(model)
    other = {k: v.clone() for k, v in inputs.items()}
    padded = inputs["attention_mask"] == 0
    g = torch.Generator().manual_seed(1)
    other["input_ids"][padded] = torch.randint(1, 99, (int(padded.sum()),), generator=g)
    other["token_type_ids"][padded] = 1 - other["token_type_ids"][padded]
    close_outputs(
        "outputs after changing padded tokens", infer(model, **other), infer(model, **inputs), inputs["attention_mask"]
    )


def check_batch_independence(subject: Subject) -> None:
    """Each example gives the same outputs alone (without its padding) as inside a padded batch."""
    model = subject.model()
    inputs = model_inputs(model)
    together = infer(model, **inputs)
    mask = inputs["attention_mask"]
    for i in range(mask.shape[0]):
        n = int(mask[i].sum()) if mask.dim() == 2 else mask.shape[-1]  # choices keep their shared length
        alone = infer(model, **{k: v[i : i + 1, ..., :n] for k, v in inputs.items()})
        row = {k: v[i : i + 1] for k, v in float_outputs(together).items()}
        for name, value in float_outputs(alone).items():
            want = row[name]
            if value.shape != want.shape and mask.dim() == 2:  # per-token: the real positions of the row
                want = want[:, :n]
            close(f"example {i} alone vs in the batch ({name})", value, want)


def check_determinism(subject: Subject) -> None:
    """Dropout off means the same answer: two eval runs agree exactly, and training mode with every dropout
    probability at zero agrees with eval mode."""
    model = subject.model()
    inputs = model_inputs(model)
    first, second = float_outputs(infer(model, **inputs)), float_outputs(infer(model, **inputs))
    for name, value in first.items():
        expect(torch.equal(value, second[name]), f"two eval-mode runs on the same input differ ({name})")
    quiet = subject.without_dropout(model)
    eval_out = infer(quiet.eval(), **inputs)
    close_outputs(
        "training mode with dropout 0 vs eval mode", infer(quiet.train(), **inputs), eval_out, inputs["attention_mask"]
    )


def check_gradients(subject: Subject) -> None:
    """Every parameter receives a finite gradient (an unused parameter breaks DDP)."""
    model = subject.model().train()
    outputs = float_outputs(model(**model_inputs(model)))
    loss = sum(value.pow(2).mean() for value in outputs.values())
    loss.backward()  # type: ignore[union-attr]
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    expect(not unused, f"parameters without a gradient (unused; DDP would fail): {', '.join(unused)}")
    bad = [name for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    expect(not bad, f"non-finite gradients: {', '.join(bad)}")


def check_checkpoint_roundtrip(subject: Subject) -> None:
    """``save_pretrained`` then ``from_pretrained`` gives the same model: no missing or unexpected keys, the same
    outputs (the component's options travel in ``config.json``)."""
    model = subject.model(seed=3)
    inputs = model_inputs(model)
    with tempfile.TemporaryDirectory() as directory:
        model.save_pretrained(directory)  # type: ignore[operator]
        loaded, info = subject.reload(directory)
    expect(not info.missing_keys, f"keys missing after the round trip: {info.missing_keys}")
    expect(not info.unexpected_keys, f"unexpected keys after the round trip: {info.unexpected_keys}")
    expect(loaded.config == model.config, "the config changed in the round trip")
    close_outputs(
        "outputs after save/load", infer(loaded.eval(), **inputs), infer(model, **inputs), inputs["attention_mask"]
    )


def check_compile(subject: Subject, backend: str | None = None) -> None:
    """``torch.compile`` (graph breaks allowed) runs the model and matches eager mode.

    ``backend`` defaults to the subject's ``compile_backend``: ``inductor`` generates and compiles C++
    (seconds per model); ``aot_eager`` traces the same graphs (where plugins break) without code generation.
    """
    import torch._dynamo

    backend = backend or subject.compile_backend
    cfg = subject.config()
    cfg["encoder"]["num_layers"] = 1  # tracing time grows with the (unrolled) layers; one shows the component
    model = subject.model(config=cfg)
    inputs = model_inputs(model)
    want = infer(model, **inputs)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend)
        got = infer(compiled, **inputs)
    finally:
        torch._dynamo.reset()
    close_outputs(f"torch.compile(backend={backend!r}) vs eager", got, want, inputs["attention_mask"])
