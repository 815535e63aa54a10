"""Downstream task data: the embedded tiny tasks, local CSV/TSV/JSONL files, and Hugging Face datasets.

The embedded tasks are generated from the grammar of the generated pre-training corpus
(:mod:`bertblocks.ablation.corpus`), with its words only, so that pre-training on that corpus helps them and
the study's tokenizer spells every word as one token:

* ``number`` (classification, 2 labels): is the subject plural? The object has a number of its own, so
  the label is the number of the first noun phrase, not of any noun: word order matters. Learnt in tens of
  steps, the task to show short studies' differences; from 1,000 examples a randomly initialised model
  learns it as well as a pre-trained one, so a study that asks what pre-training gave fine-tunes on a few
  (``train_examples: 32``; the ablation how-to has the measurements).
* ``agreement`` (classification, 2 labels): is the sentence grammatical? Half the sentences have the main
  verb's number flipped (``the cats near the old house *sees* …``); telling them apart takes the subject–verb
  agreement the masked-LM corpus teaches, across an attractor noun (a CoLA-like task). It combines two
  words' number (an exclusive or): a tiny model fine-tuned from scratch stays at chance for hundreds of steps.
* ``similarity`` (similarity-regression, score 0–5): two sentences that share the structure ``SUBJECT VERB
  OBJECT``; of five content slots (subject and object noun and adjective, the verb), ``k`` are changed and the
  score is ``5 − k`` (an STS-B-like task). Determiners change freely (same number), without changing the score.
  Matching words across the two texts takes attention that a short fine-tuning of a tiny model does not
  learn: like ``agreement``, it separates models only with longer pre-training and fine-tuning.
* ``paraphrase`` (pair-classification, 2 labels): the same pairs with ``k = 0`` (label 1: the same content,
  other determiners) or ``k`` of 1 or 2 (label 0): hard negatives (an MRPC-like task).

Every embedded task is a pure function of its name, the split and the number of examples.

Example:
    >>> train = embedded_examples("agreement", "train", 4)   # [Example(text, pair, label), ...]
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertblocks.errors import BertBlocksError
from bertblocks.readers import ReadError, read_csv, read_jsonl

from .corpus import _ADJECTIVES, _PLACES, _PLURAL, _PREPOSITIONS, _SINGULAR


@dataclass(frozen=True)
class Example:
    """One labelled example: a text (and a second text for pair tasks) and its label (a class or a score).

    ``where`` says where it came from (``file, line N``), for the errors about its label.
    """

    text: str
    pair: str | None
    label: Any
    where: str = ""


class TaskDataError(BertBlocksError, ValueError):
    """Task data that cannot be read: the message names the file (and line) or the dataset."""


# --------------------------------------------------------------------------------------- embedded tasks
def _words(rng: random.Random, plural: bool) -> dict[str, list[str]]:
    return _PLURAL if plural else _SINGULAR


def _number(rng: random.Random) -> Example:
    plural = rng.random() < 0.5
    words = _words(rng, plural)
    subject = [rng.choice(words["det"])]
    if rng.random() < 0.5:
        subject.append(rng.choice(_ADJECTIVES))
    subject.append(rng.choice(words["noun"]))
    if rng.random() < 0.3:
        subject += [rng.choice(_PREPOSITIONS), "the", rng.choice(_PLACES)]
    if rng.random() < 0.6:
        other = _words(rng, rng.random() < 0.5)
        tail = [rng.choice(words["verb"]), rng.choice(other["det"]), rng.choice(other["noun"])]
    else:
        tail = [rng.choice(words["verb_i"])]
    return Example(" ".join([*subject, *tail]) + " .", None, int(plural))


def _agreement(rng: random.Random) -> Example:
    plural = rng.random() < 0.5
    words = _words(rng, plural)
    subject = [rng.choice(words["det"])]
    if rng.random() < 0.5:
        subject.append(rng.choice(_ADJECTIVES))
    subject.append(rng.choice(words["noun"]))
    if rng.random() < 0.5:  # an attractor between subject and verb, as in the corpus
        subject += [rng.choice(_PREPOSITIONS), "the", rng.choice(_PLACES)]
    kind = rng.choice(["verb", "verb_i", "be"])
    index = rng.randrange(len(words[kind]))
    grammatical = rng.random() < 0.5
    # the singular and plural verb lists are aligned (sees/see): the other number's form at the same index
    verb = (words if grammatical else _words(rng, not plural))[kind][index]
    tail: list[str] = []
    if kind == "verb":
        other = _words(rng, rng.random() < 0.5)
        tail = [rng.choice(other["det"]), rng.choice(other["noun"])]
    elif kind == "be":
        tail = [rng.choice(_ADJECTIVES)]
    return Example(" ".join([*subject, verb, *tail]) + " .", None, int(grammatical))


#: the content slots of a similarity sentence, and where their words come from (by number)
_SLOTS = ("subject_adj", "subject_noun", "verb", "object_adj", "object_noun")


def _frame(rng: random.Random) -> dict[str, Any]:
    subject, obj = rng.random() < 0.5, rng.random() < 0.5
    return {
        "subject_plural": subject,
        "object_plural": obj,
        "subject_adj": rng.choice(_ADJECTIVES),
        "subject_noun": rng.randrange(len(_SINGULAR["noun"]) - 1),  # index: both numbers have this noun
        "verb": rng.randrange(len(_SINGULAR["verb"])),
        "object_adj": rng.choice(_ADJECTIVES),
        "object_noun": rng.randrange(len(_SINGULAR["noun"]) - 1),
    }


def _render(rng: random.Random, frame: dict[str, Any]) -> str:
    s, o = _words(rng, frame["subject_plural"]), _words(rng, frame["object_plural"])
    return " ".join(
        [
            rng.choice(s["det"]),
            frame["subject_adj"],
            s["noun"][frame["subject_noun"]],
            s["verb"][frame["verb"]],
            rng.choice(o["det"]),
            frame["object_adj"],
            o["noun"][frame["object_noun"]],
            ".",
        ]
    )


def _changed(rng: random.Random, frame: dict[str, Any], k: int) -> dict[str, Any]:
    """``frame`` with ``k`` of its content slots given another word."""
    out = dict(frame)
    for slot in rng.sample(_SLOTS, k):
        if slot.endswith("adj"):
            out[slot] = rng.choice([a for a in _ADJECTIVES if a != frame[slot]])
        else:
            size = len(_SINGULAR["verb"]) if slot == "verb" else len(_SINGULAR["noun"]) - 1
            out[slot] = rng.choice([i for i in range(size) if i != frame[slot]])
    return out


def _similarity(rng: random.Random) -> Example:
    frame = _frame(rng)
    k = rng.randrange(len(_SLOTS) + 1)
    return Example(_render(rng, frame), _render(rng, _changed(rng, frame, k)), float(len(_SLOTS) - k))


def _paraphrase(rng: random.Random) -> Example:
    frame = _frame(rng)
    same = rng.random() < 0.5
    k = 0 if same else rng.choice([1, 2])
    return Example(_render(rng, frame), _render(rng, _changed(rng, frame, k)), int(same))


_GENERATORS = {"number": _number, "agreement": _agreement, "similarity": _similarity, "paraphrase": _paraphrase}
#: examples generated when ``train_examples`` / ``eval_examples`` are left out
EMBEDDED_SIZES = {"train": 1000, "eval": 400}


def embedded_examples(name: str, split: str, n: int) -> list[Example]:
    """``n`` examples of the embedded task ``name`` for ``split`` (``train`` or ``eval``: disjoint draws)."""
    rng = random.Random(f"bertblocks-downstream:{name}:{split}")  # str seeds hash with sha512: stable
    return [_GENERATORS[name](rng) for _ in range(n)]


# ------------------------------------------------------------------------------------------ local files
def read_examples(path: Path, text: str, pair: str | None, label: str) -> list[Example]:
    """Examples from a CSV/TSV file (with a header) or JSONL (one object per line), by column names, read by
    the bounded readers (:mod:`bertblocks.readers`: size, UTF-8 with a byte order mark accepted, NUL bytes,
    the CSV field limit, a field that holds a line break, i.e. an unclosed quote).

    Raises:
        FileNotFoundError: no such file.
        TaskDataError: a folder, not UTF-8, malformed, a missing column or an empty text, with the file and line.
    """
    rows: list[tuple[int, dict[str, Any]]] = []
    try:
        if path.suffix.lower() == ".jsonl":
            for number, row in read_jsonl(path):
                if not isinstance(row, dict):
                    raise TaskDataError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
                rows.append((number, row))
        else:
            columns, rows = read_csv(path, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            missing = [c for c in (text, pair, label) if c is not None and c not in columns]
            if missing:
                raise TaskDataError(
                    f"{path}, line 1: no column(s) {', '.join(map(repr, missing))} in the header "
                    f"(columns: {', '.join(map(repr, columns)) or 'none'})"
                )
    except ReadError as e:
        raise TaskDataError(str(e)) from None
    if not rows:
        raise TaskDataError(f"{path} holds no examples")
    return [_example(row, text, pair, label, f"{path}, line {number}") for number, row in rows]


def _example(row: dict[str, Any], text: str, pair: str | None, label: str, where: str) -> Example:
    missing = [c for c in (text, pair, label) if c is not None and row.get(c) in (None, "")]
    if missing:
        present = ", ".join(map(str, row)) or "none"
        raise TaskDataError(f"{where}: no value for column(s) {', '.join(missing)} (columns: {present})")
    return Example(str(row[text]), str(row[pair]) if pair is not None else None, row[label], where)


# --------------------------------------------------------------------------------- Hugging Face datasets
def load_hf(dataset: str, split: str, text: str, pair: str | None, label: str) -> list[Example]:
    """``split`` of ``hf:DATASET[/CONFIG]`` through the ``datasets`` library (a network or its cache).

    Raises:
        TaskDataError: ``datasets`` is not installed, the dataset or split cannot be loaded (offline, say), or
            a column is missing.
    """
    if importlib.util.find_spec("datasets") is None:
        raise TaskDataError(
            f"hf:{dataset} needs the `datasets` library, which is not installed (pip install datasets); "
            "or give the task as a local .csv/.tsv/.jsonl file"
        )
    import datasets

    name, _, config = dataset.strip("/").partition("/")
    try:
        data = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # offline, unknown dataset or split: datasets raises many types
        raise TaskDataError(
            f"hf:{dataset} split {split!r} could not be loaded ({type(e).__name__}: {e}); loading a dataset "
            "needs the network (or a cached copy); offline, give the task as a local .csv/.tsv/.jsonl file"
        ) from None
    columns = list(data.column_names)
    missing = [c for c in (text, pair, label) if c is not None and c not in columns]
    if missing:
        raise TaskDataError(
            f"hf:{dataset} split {split!r} has no column(s) {', '.join(missing)} (it has: {', '.join(columns)})"
        )
    return [_example(row, text, pair, label, f"hf:{dataset} split {split!r} row {i}") for i, row in enumerate(data)]
