"""A small text corpus and a labelled toy set, generated from tiny grammars (no download, fixed seed).

The masked-LM corpus has number agreement that spans several words (``the cats near the old house
*see* …`` vs ``the cat … *sees* …``), so a model must use context to fill a masked verb or determiner: a
position scheme or attention change that hurts context shows in the eval loss. The classification set
labels short reviews by sentiment, with negation flipping it (``the film was not good`` is negative), so a
bag of words is not enough.

Example:
    >>> sentences = generate_sentences(3, seed=0)
    >>> labelled = generate_labelled(3, seed=0)   # [(text, label), ...]
"""

from __future__ import annotations

import random
from pathlib import Path

from bertblocks.readers import read_lines

from ..errors import InputError

_SINGULAR = {
    "det": ["the", "a", "every", "this", "that"],
    "noun": ["cat", "dog", "bird", "child", "teacher", "farmer", "doctor", "girl", "boy", "horse", "student"],
    "verb": ["sees", "likes", "follows", "finds", "watches", "helps", "calls", "knows", "paints", "visits"],
    "verb_i": ["sleeps", "runs", "waits", "sings", "laughs", "works", "swims"],
    "be": ["is"],
}
_PLURAL = {
    "det": ["the", "some", "these", "those", "many", "two"],
    "noun": ["cats", "dogs", "birds", "children", "teachers", "farmers", "doctors", "girls", "boys", "horses"],
    "verb": ["see", "like", "follow", "find", "watch", "help", "call", "know", "paint", "visit"],
    "verb_i": ["sleep", "run", "wait", "sing", "laugh", "work", "swim"],
    "be": ["are"],
}
_ADJECTIVES = ["small", "big", "red", "old", "young", "quiet", "happy", "tired", "clever", "brown", "tall"]
_PLACES = ["house", "river", "garden", "school", "market", "bridge", "forest", "station", "village", "hill"]
_PREPOSITIONS = ["near", "under", "behind", "beside", "inside", "across"]
_ADVERBS = ["quickly", "slowly", "quietly", "often", "today", "again"]


def _noun_phrase(rng: random.Random, words: dict[str, list[str]]) -> str:
    parts = [rng.choice(words["det"])]
    if rng.random() < 0.5:
        parts.append(rng.choice(_ADJECTIVES))
    parts.append(rng.choice(words["noun"]))
    if rng.random() < 0.3:  # a modifier between subject and verb: agreement must reach over it
        parts += [rng.choice(_PREPOSITIONS), "the", rng.choice(_PLACES)]
    return " ".join(parts)


def _sentence(rng: random.Random) -> str:
    subject = _SINGULAR if rng.random() < 0.5 else _PLURAL
    obj = _SINGULAR if rng.random() < 0.5 else _PLURAL
    form = rng.random()
    if form < 0.45:
        words = [_noun_phrase(rng, subject), rng.choice(subject["verb"]), _noun_phrase(rng, obj)]
    elif form < 0.7:
        words = [_noun_phrase(rng, subject), rng.choice(subject["verb_i"])]
        if rng.random() < 0.6:
            words.append(rng.choice(_ADVERBS))
    elif form < 0.85:
        words = [_noun_phrase(rng, subject), rng.choice(subject["be"]), rng.choice(_ADJECTIVES)]
    else:
        words = [_noun_phrase(rng, subject), rng.choice(subject["verb"]), _noun_phrase(rng, obj), "and"]
        other = _SINGULAR if rng.random() < 0.5 else _PLURAL
        words += [_noun_phrase(rng, other), rng.choice(other["verb_i"])]
    return " ".join(words) + " ."


def generate_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences from the agreement grammar; the same ``seed`` gives the same list."""
    rng = random.Random(seed)
    return [_sentence(rng) for _ in range(n)]


_SUBJECTS = ["the film", "this book", "the food", "the hotel", "the service", "that song", "the game", "the show"]
_POSITIVE = ["good", "great", "wonderful", "excellent", "lovely", "fun", "superb", "pleasant"]
_NEGATIVE = ["bad", "awful", "boring", "terrible", "dull", "poor", "horrible", "weak"]
_INTENSIFIERS = ["very", "really", "quite", "truly", "rather"]
_OPENERS = ["honestly", "overall", "in the end", "to be fair", "i think"]


def generate_labelled(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """``n`` toy reviews with labels (1 positive, 0 negative); ``not`` flips an adjective's polarity."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        positive = rng.random() < 0.5
        negated = rng.random() < 0.4
        words = []
        if rng.random() < 0.3:
            words.append(rng.choice(_OPENERS))
        words += [rng.choice(_SUBJECTS), rng.choice(["was", "is", "seemed"])]
        if negated:
            words.append("not")
        if rng.random() < 0.4:
            words.append(rng.choice(_INTENSIFIERS))
        words.append(rng.choice(_POSITIVE if positive else _NEGATIVE))
        out.append((" ".join(words) + " .", int(positive != negated)))
    return out


def _numbered_lines(path: Path) -> list[tuple[int, str]]:
    """The non-empty lines of a UTF-8 text file, stripped, with their line numbers (from 1), read by
    :func:`bertblocks.readers.read_lines` (bounded size, UTF-8 with a byte order mark accepted, no NUL byte).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a folder, a line that is not UTF-8 or holds a NUL byte (a :class:`~bertblocks.readers.ReadError`
            naming the file, the line and the byte), or no text at all.
    """
    lines = []
    for number, text in read_lines(path):
        # str.splitlines also breaks at the separators a line keeps (\r, \x0b, \x1c, \u2028, …)
        lines.extend((number, part.strip()) for part in text.splitlines() if part.strip())
    if not lines:
        raise InputError(f"corpus file {path} holds no text")
    return lines


def read_sentences(path: Path) -> list[str]:
    """Non-empty lines of a UTF-8 text file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds no text, or a line that is not UTF-8 (with its number).
    """
    return [line for _, line in _numbered_lines(path)]


def read_labelled(path: Path) -> list[tuple[str, int]]:
    """``LABEL<TAB>TEXT`` lines (LABEL an integer from 0).

    Raises:
        ValueError: a line that is not of that form, or not UTF-8, with its number in the file.
    """
    out = []
    for number, line in _numbered_lines(path):
        label, sep, text = line.partition("\t")
        if not sep or not label.strip().isdigit() or not text.strip():
            raise InputError(f"{path}, line {number}: expected LABEL<TAB>TEXT with an integer label")
        out.append((text.strip(), int(label)))
    return out
