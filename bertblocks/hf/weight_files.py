"""Reading weight files someone may send you: safetensors validated before any tensor is made, and
``pytorch_model.bin`` only as plain tensors (``torch.load(weights_only=True)``).

What a safetensors file is checked for, before one tensor is made (each error names the file and, where
there is one, the tensor):

* at least the 8-byte header length, and a header length that fits in the file and stays under
  :data:`MAX_HEADER_BYTES` (100 MB, as the ``safetensors`` library);
* a header that is UTF-8 JSON holding an object, with no name given twice;
* for every tensor: exactly ``dtype``, ``shape`` and ``data_offsets``; a known ``dtype``; a shape of
  non-negative integers; offsets ``[begin, end]`` with ``begin <= end`` inside the data;
  ``prod(shape) × dtype size == end - begin``;
* the tensors' bytes neither overlap nor leave holes, and cover the data exactly (as ``safetensors``
  requires, so no file is two things at once).

A ``.bin`` file is a pickle; pickles can run code, so it is read with ``weights_only=True``, which allows
tensors and plain containers only. A file that asks for anything else is refused with a
:class:`WeightFileError` naming the file and what it asked for; the advice is to convert the file in a
trusted environment, never to turn the check off. Files from torch < 1.6 (not a zip archive) are read
without a memory map, as transformers does, since ``mmap`` needs the zip format.
"""

from __future__ import annotations

import json
import math
import mmap
import pickle
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import BertBlocksError, InputError
from ..readers import ReadError, parse_json

#: the largest header accepted (the ``safetensors`` library's own limit)
MAX_HEADER_BYTES = 100_000_000
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}


def _dtypes() -> dict[str, torch.dtype]:
    names = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U64": "uint64",
        "U32": "uint32",
        "U16": "uint16",
        "U8": "uint8",
        "BOOL": "bool",
    }
    return {code: getattr(torch, name) for code, name in names.items() if hasattr(torch, name)}


#: safetensors dtype code → torch dtype (those this torch has)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = _dtypes()


class WeightFileError(BertBlocksError, ValueError):
    """A weight file that is damaged, malformed or unsafe; ``path`` and ``tensor`` say where.

    Attributes:
        path: the file.
        tensor: the tensor the problem is in, or ``None`` for the file as a whole.
    """

    def __init__(self, path: Path | str, problem: str, tensor: str | None = None) -> None:
        self.path, self.tensor, self.problem = Path(path), tensor, problem
        where = f"{path}: tensor {tensor!r}" if tensor is not None else str(path)
        super().__init__(f"{where}: {problem}")


# ------------------------------------------------------------------------------------------ safetensors
def read_safetensors_header(path: Path, data: bytes | mmap.mmap) -> tuple[dict[str, dict[str, Any]], int]:
    """The validated tensor entries of a safetensors file and where its data start.

    Args:
        path: the file (for messages).
        data: the file's bytes (or a memory map of them).

    Returns:
        ``({name: {"dtype", "shape", "data_offsets"}}, data start)``; ``__metadata__`` is left out.

    Raises:
        WeightFileError: anything listed in the module docstring.
    """
    size = len(data)
    if size < 8:
        raise WeightFileError(
            path, f"not a valid safetensors file: {size} bytes, shorter than the 8-byte header length"
        )
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > min(MAX_HEADER_BYTES, size - 8):
        limit = "the file" if header_size > size - 8 else f"the {MAX_HEADER_BYTES:,}-byte limit"
        raise WeightFileError(
            path, f"not a valid safetensors file: the header claims {header_size:,} bytes, more than {limit} holds"
        )
    try:  # the one JSON parser: nesting bounded, a name given twice refused
        header = parse_json(bytes(data[8 : 8 + header_size]), path)
    except ReadError as e:
        raise WeightFileError(path, f"not a valid safetensors file: the header is not JSON ({e.problem})") from None
    if not isinstance(header, dict):
        raise WeightFileError(
            path, f"not a valid safetensors file: the header is a JSON {type(header).__name__}, not an object"
        )
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not isinstance(metadata, dict):
        raise WeightFileError(path, "not a valid safetensors file: __metadata__ is not an object")
    start = 8 + header_size
    data_size = size - start
    spans = []
    for name, entry in header.items():
        _check_entry(path, name, entry, data_size)
        begin, end = entry["data_offsets"]
        spans.append((begin, end, name))
    # sorted by position, every tensor must start where the one before ended: no overlap, no hole
    spans.sort()
    position, previous = 0, None
    for begin, end, name in spans:
        if begin < position:
            raise WeightFileError(path, f"not a valid safetensors file: its bytes overlap those of {previous!r}", name)
        if begin > position:
            raise WeightFileError(
                path, f"not a valid safetensors file: bytes {position}-{begin} before it belong to no tensor", name
            )
        position, previous = end, name
    if position != data_size:
        raise WeightFileError(
            path,
            f"not a valid safetensors file: the tensors cover {position:,} bytes of data but the file holds "
            f"{data_size:,} (truncated, or bytes after the last tensor)",
        )
    return header, start


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(path: Path, name: str, entry: Any, data_size: int) -> None:
    def fail(problem: str) -> WeightFileError:
        return WeightFileError(path, f"not a valid safetensors file: {problem}", name)

    if not isinstance(entry, dict):
        raise fail(f"its header entry is a JSON {type(entry).__name__}, not an object")
    if set(entry) != _ENTRY_KEYS:
        missing, extra = sorted(_ENTRY_KEYS - set(entry)), sorted(set(entry) - _ENTRY_KEYS)
        parts = ([f"lacks {', '.join(missing)}"] if missing else []) + (
            [f"has unknown keys {', '.join(extra)}"] if extra else []
        )
        raise fail(f"its header entry {' and '.join(parts)}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise fail(f"unknown dtype {dtype!r}; known: {', '.join(SAFETENSORS_DTYPES)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
        raise fail(f"shape {shape!r} is not a list of non-negative integers")
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_index(o) for o in offsets)):
        raise fail(f"data_offsets {offsets!r} is not [begin, end] of non-negative integers")
    begin, end = offsets
    if begin > end:
        raise fail(f"data_offsets {offsets} end before they begin")
    if end > data_size:
        raise fail(f"data_offsets {offsets} go past the end of the data ({data_size:,} bytes; truncated file?)")
    itemsize = torch.empty((), dtype=SAFETENSORS_DTYPES[dtype]).element_size()
    expected = math.prod(shape) * itemsize
    if expected != end - begin:
        raise fail(f"shape {shape} of {dtype} needs {expected:,} bytes but data_offsets {offsets} hold {end - begin:,}")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, validated first, as views of a private memory map of it.

    No copy is made: the tensors *are* the file's pages (copy-on-write, so writing to a parameter later
    copies only the pages written, and never changes the file).

    Raises:
        WeightFileError: a file that is empty, damaged or malformed (see the module docstring), naming the
            file and the tensor.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        except ValueError:  # an empty file cannot be mapped
            raise WeightFileError(path, "is empty, not a safetensors file") from None
    header, start = read_safetensors_header(path, mapped)
    tensors: dict[str, torch.Tensor] = {}
    for name, entry in header.items():
        dtype = SAFETENSORS_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = (end - begin) // itemsize
        if count == 0:
            tensors[name] = torch.empty(entry["shape"], dtype=dtype)
        elif (start + begin) % itemsize:
            # misaligned for its dtype (the safetensors writer pads the header so this never happens): copy
            raw = bytearray(mapped[start + begin : start + end])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).view(entry["shape"])
        else:
            tensors[name] = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin).view(
                entry["shape"]
            )
    return tensors


def write_safetensors(
    f: IO[bytes], tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> None:
    """Stream tensors into an open file in the safetensors format, one tensor at a time (no copy of the
    whole state in memory), so that a failed write is the OS's error (disk full), not a library's.

    The layout is the ``safetensors`` library's: an 8-byte little-endian header length, a JSON header padded
    with spaces to a multiple of 8, then the tensors' bytes, larger element sizes first so that every tensor
    is aligned for its dtype.

    Args:
        f: the binary file to write into.
        tensors: contiguous CPU or device tensors (copied to the CPU one at a time).
        metadata: string pairs for ``__metadata__`` (``{"format": "pt"}`` as transformers writes).

    Raises:
        ValueError: a dtype safetensors cannot store, or a name given as ``__metadata__``.
    """
    codes = {dtype: code for code, dtype in SAFETENSORS_DTYPES.items()}
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        tensor = tensors[name]
        if name == "__metadata__" or tensor.dtype not in codes:
            raise InputError(f"cannot write tensor {name!r} ({tensor.dtype}) to safetensors")
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": codes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for name in order:
        tensor = tensors[name]
        if tensor.numel():
            data = tensor.detach().reshape(-1).contiguous().cpu().view(torch.uint8)
            f.write(memoryview(data.numpy()))


# ------------------------------------------------------------------------------------------ .bin (pickle)
def read_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``pytorch_model.bin``, read with ``weights_only=True`` (no code runs).

    Zip-format files (torch >= 1.6) are memory-mapped; older ones are read whole, as transformers does.

    Raises:
        WeightFileError: a file that is damaged, asks to run code or to build objects other than tensors
            (refused, naming what it asked for), or does not hold a mapping of names to tensors.
    """
    path = Path(path)
    mmap_ok = zipfile.is_zipfile(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap_ok)
    except pickle.UnpicklingError as e:
        raise WeightFileError(
            path,
            f"refused: the file asks to build objects other than tensors ({_refusal(e)}). bertblocks reads "
            ".bin files as plain tensors only, because a pickle can run any code; if you trust the file's "
            "origin, convert it to safetensors in an isolated environment, or get a safetensors copy of the "
            "checkpoint",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise WeightFileError(path, f"cannot be read as a PyTorch weight file ({_first_line(e)})") from None
    if not isinstance(state, dict):
        raise WeightFileError(path, f"holds a {type(state).__name__}, not a mapping of names to tensors")
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise WeightFileError(path, f"holds a {type(value).__name__}, not a tensor", str(name))
    return state


def _refusal(error: Exception) -> str:
    """The line of torch's message that says what the pickle wanted (never its advice to disable the check)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        lowered = line.lower()
        if "global" in lowered or "unsupported" in lowered or "forbidden" in lowered:
            return line.rstrip(".")
    useful = [line for line in lines if "weights_only" not in line and "trusted source" not in line.lower()]
    return useful[0].rstrip(".") if useful else "an unsupported pickle instruction"


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def read_weight_file(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of one weight file: ``.safetensors`` validated and memory-mapped, anything else as a
    ``.bin`` pickle with ``weights_only=True``."""
    path = Path(path)
    return read_safetensors(path) if path.suffix == ".safetensors" else read_torch_bin(path)


# ------------------------------------------------------------------------------- a head's files of its own
#: the conversion of a pickled companion file (text shown to the user, not a write of the library's)
CONVERT = (
    'python -c "import torch; from safetensors.torch import save_file as save; '
    "save(torch.load('{pt}', weights_only=True), '{stem}.safetensors')\""
)


def read_companion_file(
    directory: Path, stem: str, expected: Mapping[str, torch.Size]
) -> dict[str, torch.Tensor] | None:
    """The tensors of a module's weight file of its own beside a checkpoint (BGE-M3 publishes its heads as
    ``colbert_linear.pt`` and ``sparse_linear.pt`` next to ``model.safetensors``): ``<stem>.safetensors``, else
    ``<stem>.pt`` when its bytes are safetensors; ``None`` when there is neither.

    A pickled file is refused without being unpickled (a pickle can run code), with the command that converts it.

    Args:
        directory: the checkpoint folder.
        stem: the file's name without suffix.
        expected: the module's tensor names (as in its ``state_dict``) and shapes; the file must hold exactly these.

    Raises:
        WeightFileError: a pickled or damaged file, or one whose tensor names or shapes are not the module's.
    """
    path = next(
        (directory / f"{stem}{s}" for s in (".safetensors", ".pt") if (directory / f"{stem}{s}").is_file()), None
    )
    if path is None:
        return None
    with open(path, "rb") as f:  # nine bytes to tell the format; the file itself is read by read_safetensors
        start = f.read(9)
    # safetensors: an 8-byte header length, then its JSON header, "{" at byte 8 (the first byte may be 0x80, so
    # that alone says nothing); torch.save writes a zip archive or, before 1.6, a raw pickle (0x80)
    if not (len(start) == 9 and start[8:9] == b"{") and (start.startswith(b"PK\x03\x04") or start[:1] == b"\x80"):
        raise WeightFileError(
            path,
            "is a pickled PyTorch file; bertblocks never unpickles (a pickle can run code). Convert it once, where "
            "you trust the file, with safetensors' save_file: " + CONVERT.format(pt=path.name, stem=stem),
        )
    tensors = read_safetensors(path)
    if set(tensors) != set(expected):
        raise WeightFileError(path, f"holds {sorted(tensors)}; the {stem} module's file holds {sorted(expected)}")
    for key, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[key]):
            raise WeightFileError(
                path, f"shape {tuple(tensor.shape)}, but the model's {stem}.{key} is {tuple(expected[key])}", key
            )
    return tensors
