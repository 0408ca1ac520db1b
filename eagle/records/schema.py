"""The one way a file the product reads is checked: kinds, shapes and ranges, and one error type.

Each reader checks its file once, where it opens it, with these helpers, and a malformed file becomes
a FileFormatError naming the file and the field in one sentence. FileFormatError is a ValueError, so
the command boundary (eagle.records.files.run_guarded) turns it into exit code 2, the notebook API lets it
through as is and the dashboard shows it in an error box. Readers of caches catch it and measure again;
readers of line files (traces, open.jsonl) skip and count the bad line instead."""
from __future__ import annotations

import math
from pathlib import Path
from typing import NoReturn

import torch


class FileFormatError(ValueError):
    """A file the product reads is malformed; the message names the file and the field."""


def fail(path: str | Path, field: str, problem: str) -> NoReturn:
    raise FileFormatError(f"{path}: {field} {problem}.")


# Kinds of a JSON value: "int", "nat" (int >= 0), "num" (finite int or float), "nonneg" (a num >= 0), "positive"
# (a num > 0), "str", "bool", "dict",
# "list", "ints" (a list of ints), "numdict" (an object of numbers); a trailing "?" also allows null.
_TYPES = {"int": int, "str": str, "bool": bool, "dict": dict, "list": list}


def is_kind(value: object, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or is_kind(value, kind[:-1])
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "nat":
        return type(value) is int and value >= 0
    if kind == "nonneg":
        return is_kind(value, "num") and value >= 0
    if kind == "positive":
        return is_kind(value, "num") and value > 0
    if kind == "ints":
        return isinstance(value, list) and all(type(v) is int for v in value)
    if kind == "numdict":
        return isinstance(value, dict) and all(is_kind(v, "num") for v in value.values())
    return type(value) is _TYPES[kind]  # `type is`: a bool is not an int here


def _kind_name(kind: str) -> str:
    name = {"nat": "an integer >= 0", "num": "a finite number", "nonneg": "a finite number >= 0",
            "positive": "a finite number > 0", "ints": "a list of integers",
            "numdict": "an object of numbers", "int": "an integer", "str": "a string", "bool": "true or false",
            "dict": "an object", "list": "a list"}[kind.rstrip("?")]
    return name + (" or null" if kind.endswith("?") else "")


def check_object(obj: object, path: str | Path, what: str, fields: dict[str, str],
                 optional: dict[str, str] | None = None) -> dict:
    """`obj` is a JSON object holding every field of `fields` and, where present, those of `optional`,
    each of its kind; returns it. `what` names the object inside the file ("manifest", "line 3")."""
    if obj is None:
        fail(path, what, "is missing or null")
    if not isinstance(obj, dict):
        fail(path, what, f"is {type(obj).__name__}, not an object")
    for name, kind in fields.items():
        if name not in obj:
            fail(path, f"{what} field {name!r}", "is missing")
        check_value(obj[name], path, f"{what} field {name!r}", kind)
    for name, kind in (optional or {}).items():
        if name in obj:
            check_value(obj[name], path, f"{what} field {name!r}", kind)
    return obj


def check_value(value: object, path: str | Path, field: str, kind: str) -> object:
    if not is_kind(value, kind):
        fail(path, field, f"is {value!r:.40}, not {_kind_name(kind)}")
    return value


def check_in(value: object, choices: tuple, path: str | Path, field: str) -> object:
    if isinstance(value, bool) or value not in choices:
        fail(path, field, f"is {value!r:.40}, not one of {', '.join(map(repr, sorted(choices, key=str)))}")
    return value


def check_tensor(t: torch.Tensor, path: str | Path, field: str, shape: tuple[int | None, ...],
                 kind: str) -> torch.Tensor:
    """A tensor of `kind` ("int", "float" or "bool") and of `shape` (None: any size along that axis)."""
    ok_kind = {"int": not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool,
               "float": t.is_floating_point(), "bool": t.dtype == torch.bool}[kind]
    if not ok_kind:
        fail(path, field, f"is {str(t.dtype).removeprefix('torch.')}, not {kind}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = tuple("any" if s is None else s for s in shape)
        fail(path, field, f"has shape {tuple(t.shape)}, expected {want}")
    return t


def check_ids(t: torch.Tensor, vocab_size: int, path: str | Path, field: str) -> torch.Tensor:
    """Token ids within the vocabulary [0, vocab_size)."""
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
        bad = int(t.min()) if int(t.min()) < 0 else int(t.max())
        fail(path, field, f"holds token id {bad}, outside the vocabulary of {vocab_size}")
    return t


def check_offsets(offsets: torch.Tensor, total: int, path: str | Path, field: str = "offsets") -> list[int]:
    """Sample boundaries: 1-D, from 0, never decreasing, ending at `total` (the flat tensors' length)."""
    check_tensor(offsets, path, field, (None,), "int")
    values = offsets.tolist()
    if not values or values[0] != 0 or values[-1] != total:
        fail(path, field, f"must run from 0 to {total} (the tokens the shard holds), got {values[:1]}..{values[-1:]}")
    if any(b < a for a, b in zip(values, values[1:])):
        fail(path, field, "go backwards")
    return values
