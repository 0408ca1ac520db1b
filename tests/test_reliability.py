"""Bad input and long runs: clear errors, nothing lost, the cache never overflows; and issue 16's
integrity cases: concurrent writers, kill -9 of every resumable job, a corrupted-file matrix."""
import io
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.__main__ import main as analysis_main
from analysis.export import load_traces
from eagle import bench, cli, decode, target as target_module, train
from eagle.config import DecodeConfig
from eagle.data import read_sharegpt
from eagle.decode import Decoder, PromptError, generate
from eagle.distill import DistillConfig, regenerate
from eagle.distill_store import OPEN_FILE, SETTING_FIELDS, DistillStore, ReadStats
from eagle.files import exclusive_lock, run_guarded
from eagle.head import COUNTS_FILE, load_head, save_head
from eagle.target import ModelLoadError, load_target
from eagle.trace import (INTERRUPTED, NodeRecord, StepRecord, Trace, TraceFormatError, TraceHeader, append_trace,
                         read_trace, write_trace)
from tests.tiny import ByteTokenizer, tiny_pair

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.mark.parametrize("field, value, message", [
    ("total_tokens", 0, "total_tokens"), ("total_tokens", 5000, "total_tokens"), ("depth", -1, "depth"),
    ("top_k", 0, "top_k"), ("temperature", -0.5, "temperature"), ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"), ("max_new_tokens", 0, "max_new_tokens"), ("mode", "medusa", "mode"),
])
def test_out_of_range_parameters_are_one_clear_sentence(field, value, message):
    with pytest.raises(ValueError, match=message) as err:
        DecodeConfig().with_(**{field: value})
    assert str(err.value).count(".") <= 2 and "\n" not in str(err.value)


@pytest.mark.parametrize("mode, temperature", [("vanilla", 0.0), ("static", 0.0), ("dynamic", 0.0),
                                               ("static", 0.9), ("dynamic", 0.9)])
def test_1024_new_tokens_in_every_mode(mode, temperature):
    target, head = tiny_pair(vocab=16, seed=2, eos=None)
    target.model.config.max_position_embeddings = 2048
    cfg = DecodeConfig(mode=mode, max_new_tokens=1100, temperature=temperature, total_tokens=12, depth=3, top_k=3)
    g = generate(Decoder(target, head, cfg), [1, 2, 3])
    assert len(g.tokens) == 1100 and g.finished == "max_new_tokens"


@pytest.mark.parametrize("mode", ["vanilla", "static", "dynamic"])
def test_prompt_near_the_context_limit_stops_cleanly(mode):
    target, head = tiny_pair(vocab=16, seed=3, eos=None)
    target.model.config.max_position_embeddings = 64
    g = generate(Decoder(target, head, DecodeConfig(mode=mode, max_new_tokens=50, total_tokens=30)), [1] * 60)
    assert g.finished == "context" and 1 <= len(g.tokens) <= 4
    with pytest.raises(PromptError, match="context holds 64"):
        next(Decoder(target, head, DecodeConfig(mode=mode)).steps([1] * 64))


def test_mode_needing_a_head_without_one():
    target, _ = tiny_pair()
    with pytest.raises(ValueError, match="needs a draft head"):
        Decoder(target, None, DecodeConfig(mode="dynamic"))


# ---- trace files ----------------------------------------------------------------------------
def _trace(n_steps: int) -> Trace:
    node = NodeRecord(0, -1, 0, 5, "a", 1.0, 1.0, 0, True, True, None)
    steps = [StepRecord(i, "dynamic", [node], [0], 7, "b", [7], "b", 1, {"verify": 0.1}) for i in range(n_steps)]
    return Trace(TraceHeader("m", None, asdict(DecodeConfig()), "p", 3), steps)


def test_truncated_trace_keeps_every_complete_record(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, [_trace(5), _trace(3)])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])  # cut the last record in half
    traces, report = read_trace(path)
    assert [len(t.steps) for t in traces] == [5, 2] and report.skipped_lines == 1


def test_not_a_trace_is_refused(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"hello": 1}\nnot json\n')
    with pytest.raises(TraceFormatError, match="no readable trace"):
        read_trace(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.lists(st.one_of(st.text(max_size=40), st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
                                  st.just('{"kind": "step"}'), st.just('{"kind": "header", "schema": 1}')),
                        max_size=6),
       where=st.integers(0, 8))
def test_trace_reader_fuzz(tmp_path, garbage, where):
    """Random junk spliced into a valid trace: every valid record is still read, junk is counted."""
    good = _trace(8)
    lines = [json.dumps(good.header.to_dict())] + [json.dumps(s.to_dict()) for s in good.steps]
    junk = [g.replace("\n", " ").replace("\r", " ") for g in garbage]
    junk = [j for j in junk if j.strip()]
    at = min(1 + where, len(lines))
    path = tmp_path / "fuzz.jsonl"
    path.write_text("\n".join(lines[:at] + junk + lines[at:]) + "\n", encoding="utf-8")
    traces, report = read_trace(path)
    assert sum(len(t.steps) for t in traces) == 8
    assert report.skipped_lines == len(junk)


@pytest.mark.parametrize("total_tokens, depth, top_k", [(1, 6, 10), (2, 1, 1), (5, 1, 4), (30, 4, 1)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_degenerate_budgets_still_decode_losslessly(total_tokens, depth, top_k, temperature):
    """top_k 1, depth 1 and total_tokens 1 (a verify of the root alone) are valid budgets."""
    target, head = tiny_pair(vocab=16, seed=5, eos=None)
    base = DecodeConfig(max_new_tokens=40, temperature=temperature, seed=7)
    ref = generate(Decoder(target, None, base.with_(mode="vanilla")), [1, 2, 3])
    cfg = base.with_(mode="dynamic", total_tokens=total_tokens, depth=depth, top_k=top_k)
    g = generate(Decoder(target, head, cfg), [1, 2, 3])
    assert len(g.tokens) == 40
    if temperature == 0.0:
        assert g.tokens == ref.tokens
    assert all(sum(n.kept for n in s.nodes) <= total_tokens for s in g.steps)


def test_all_equal_draft_confidences_keep_a_connected_tree():
    """A head whose output is constant gives every child the same confidence: ties everywhere."""
    target, head = tiny_pair(vocab=16, seed=6, eos=None)
    for p in head.layers[0].parameters():
        p.data.zero_()
    head.fc.weight.data.zero_()
    head.fc.bias.data.zero_()
    g = generate(Decoder(target, head, DecodeConfig(mode="dynamic", max_new_tokens=20, total_tokens=9,
                                                    depth=3, top_k=3)), [1, 2, 3])
    for step in g.steps[1:]:
        by_id = {n.id: n for n in step.nodes}
        assert all(by_id[n.parent].kept for n in step.nodes[1:] if n.kept)
        assert sum(n.kept for n in step.nodes) == 9


# =============================================================================================
# Integrity (issue 16): nothing silently mixed or lost, one sentence for every bad input.
# Cases run on the tiny Llama unless they need the real tokenizer or the CLI's own model loading.
# =============================================================================================
def _one_sentence(err: str) -> str:
    """The stderr of a refused command: no traceback, exactly one `error:` line (progress bars and
    the dtype note of a model load may precede it)."""
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    return errors[0]


def _step(i: int, mode: str = "dynamic", finished: str | None = None, text: str = "b") -> StepRecord:
    node = NodeRecord(0, -1, 0, 5, "a", 1.0, 1.0, 0, True, True, None)
    return StepRecord(i, mode, [node], [0], 7, text, [7], text, 1, {"verify": 0.1}, 1, finished)


def _finished_trace(n_steps: int, writer: str = "w", mode: str = "dynamic") -> Trace:
    steps = [_step(i, mode, "eos" if i == n_steps - 1 else None, writer) for i in range(n_steps)]
    return Trace(TraceHeader("m", None, {"mode": mode}, "p", 3, {"writer": writer}), steps)


def _lines(trace: Trace, with_ids: bool = True) -> list[str]:
    gen = trace.header.generation
    head = {**trace.header.to_dict()}
    steps = [{**s.to_dict(), "generation": gen} for s in trace.steps]
    if not with_ids:  # a version-1 file
        head = {k: v for k, v in head.items() if k != "generation"} | {"version": 1}
        steps = [s.to_dict() for s in trace.steps]
    return [json.dumps(head)] + [json.dumps(s) for s in steps]


# ---- trace writers and the reader -----------------------------------------------------------
def _append_many(path: str, writer: str, count: int) -> None:
    for i in range(count):
        append_trace(path, _finished_trace(1 + (i * 37) % 120, writer))  # up to ~30 kB: many pages


def test_two_concurrent_writers_on_one_trace_never_mix(tmp_path):
    path = tmp_path / "t.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), w, 25)) for w in ("A", "B")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    traces, report = read_trace(path)
    assert report.skipped_lines == 0 and report.dropped_traces == 0 and len(traces) == 50
    for t in traces:
        assert {s.new_text for s in t.steps} == {t.header.meta["writer"]}
        assert [s.step for s in t.steps] == list(range(len(t.steps))) and not t.interrupted


def test_append_after_a_torn_line_starts_a_fresh_line(tmp_path):
    path = tmp_path / "t.jsonl"
    append_trace(path, _finished_trace(4, "A"))
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # a writer killed mid-line
    append_trace(path, _finished_trace(3, "B"))
    traces, report = read_trace(path)
    assert [(t.header.meta["writer"], len(t.steps)) for t in traces] == [("A", 3), ("B", 3)]
    assert report.skipped_lines == 1 and report.interrupted == 1  # A lost its last step and says so
    assert [s.step for s in traces[1].steps] == [0, 1, 2]


def test_legacy_interleaved_trace_is_dropped_and_reported(tmp_path):
    """Version-1 lines of two generations interleaved (the old per-step writer): 0,0,1,1,..."""
    a, b = _finished_trace(3, "A"), _finished_trace(3, "B")
    la, lb = _lines(a, with_ids=False), _lines(b, with_ids=False)
    lines = [la[0], lb[0]] + [x for pair in zip(la[1:], lb[1:]) for x in pair] + _lines(_finished_trace(2, "C"))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    traces, report = read_trace(path)
    assert [t.header.meta["writer"] for t in traces] == ["A", "C"]  # A has only its header: interrupted
    assert traces[0].steps == [] and report.interrupted == 1
    assert report.dropped_traces == 1 and report.skipped_lines == 7
    assert any("step numbers go 0 -> 0" in e for e in report.errors)
    assert any("mixed up" in m for m in report.messages(path))


@pytest.mark.parametrize("change, reason", [
    (lambda steps: steps.insert(2, _step(0)), "step numbers go 1 -> 0"),
    (lambda steps: steps.insert(2, _step(1)), "step numbers go 1 -> 1"),
    (lambda steps: steps.insert(2, _step(2, "static")), "the mode changes"),
    (lambda steps: steps.append(_step(9)), "after the generation finished"),
])
def test_a_trace_whose_steps_do_not_follow_is_dropped(tmp_path, change, reason):
    bad = _finished_trace(4, "A")
    change(bad.steps)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(_lines(bad) + _lines(_finished_trace(2, "B"))) + "\n")
    traces, report = read_trace(path)
    assert [t.header.meta["writer"] for t in traces] == ["B"] and report.dropped_traces == 1
    assert reason in report.errors[0] and report.skipped_lines == 6


def test_a_step_of_another_generation_is_skipped(tmp_path):
    a, b = _finished_trace(3, "A"), _finished_trace(2, "B")
    la, lb = _lines(a), _lines(b)
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([la[0], la[1], lb[1], *la[2:], *lb]) + "\n")
    traces, report = read_trace(path)
    assert [len(t.steps) for t in traces] == [3, 2] and report.skipped_lines == 1
    assert "generation" in report.errors[0]


CORRUPT_STEPS = [("confidence", None), ("confidence", "0.5"), ("kept", 1), ("token", 1.5), ("step", "3"),
                 ("new_tokens", [1, None]), ("timings", {"verify": "x"}), ("finished", 3), ("extra", 1)]


@pytest.mark.parametrize("field, value", CORRUPT_STEPS)
def test_wrong_field_types_are_skipped_not_passed_on(tmp_path, field, value):
    good = _finished_trace(4, "A")
    lines = _lines(good)
    bad = json.loads(lines[2])
    if field in NodeRecord.__dataclass_fields__:
        bad["nodes"][0][field] = value
    else:
        bad[field] = value
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    traces, report = read_trace(path)
    assert report.skipped_lines == 1 and repr(field) in report.errors[0]
    # the remaining steps 0, 2, 3 still follow each other, so the trace is kept without step 1
    assert [s.step for s in traces[0].steps] == [0, 2, 3]


def test_a_version_1_trace_still_reads(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(_lines(_finished_trace(3), with_ids=False)) + "\n")
    traces, report = read_trace(path)
    assert len(traces[0].steps) == 3 and report.skipped_lines == 0 and report.interrupted == 0


def test_write_trace_is_atomic_with_unique_temporaries(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, [_finished_trace(2)])
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]
    assert read_trace(path)[0][0].header.generation  # every header has an id


# ---- the head: corrupted files, bad configs, atomic saves -------------------------------------
def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    (path / "config.json").write_text(json.dumps(config))


HEAD_DAMAGE = {
    "truncated weights": (lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:900]),
                          "model.safetensors is corrupt"),
    "garbage weights": (lambda p: (p / "model.safetensors").write_bytes(b"\x00" * 64), "model.safetensors is corrupt"),
    "truncated token counts": (lambda p: (p / COUNTS_FILE).write_bytes(b"{}"), "token_counts.safetensors is corrupt"),
    "invalid JSON config": (lambda p: (p / "config.json").write_text('{"hidden_size": 32,'), "config.json is not valid JSON"),
    "config not an object": (lambda p: (p / "config.json").write_text("[1, 2]"), "is not a JSON object"),
    "heads do not divide the hidden size": (lambda p: _edit_config(p, num_attention_heads=5, head_dim=None),
                                            "does not divide by num_attention_heads 5"),
    "kv heads do not divide the heads": (lambda p: _edit_config(p, num_key_value_heads=3), "num_key_value_heads 3"),
    "more heads than the weights have": (lambda p: _edit_config(p, num_attention_heads=5),
                                         "weights do not match its config.json"),
    "intermediate size differs": (lambda p: _edit_config(p, intermediate_size=48), "weights do not match its config.json"),
    "hidden size differs from the target": (lambda p: _edit_config(p, hidden_size=16), "hidden_size 16 but the target"),
    "corrupt pytorch_model.bin": (lambda p: ((p / "model.safetensors").unlink(), (p / "pytorch_model.bin").write_bytes(b"PK")),
                                  "pytorch_model.bin is corrupt"),
}


@pytest.mark.parametrize("damage", sorted(HEAD_DAMAGE))
def test_damaged_head_is_one_sentence_naming_the_file(tmp_path, damage):
    target, head = tiny_pair()
    head.token_counts += 1
    save_head(head, tmp_path / "h")
    corrupt, message = HEAD_DAMAGE[damage]
    corrupt(tmp_path / "h")
    with pytest.raises(ValueError) as err:
        load_head(tmp_path / "h", target)
    assert message in str(err.value) and str(tmp_path / "h") in str(err.value) and "\n" not in str(err.value)


def _save_many(path: str, seed: int) -> None:
    _, head = tiny_pair(seed=seed)
    head.token_counts += 1
    for _ in range(15):
        save_head(head, path)


def test_concurrent_save_head_leaves_a_whole_head(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path / "h"), seed)) for seed in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(p.name for p in (tmp_path / "h").iterdir()) == [COUNTS_FILE, "config.json", "model.safetensors"]
    target, _ = tiny_pair()
    assert int(load_head(tmp_path / "h", target).token_counts.sum()) == 12


# ---- generate: the error boundary, the trace, interruption (tiny model behind the CLI) -----------
class _Tokenizer(ByteTokenizer):
    def encode(self, text: str) -> list[int]:
        return [1 + ord(c) % 10 for c in text]


@pytest.fixture
def tiny_cli(monkeypatch, tmp_path):
    """`python -m eagle generate` in-process with the tiny Llama instead of loading a model."""
    target, head = tiny_pair(eos=None)
    target.tokenizer = _Tokenizer()
    target.tokenizer.eos_token_id = None
    monkeypatch.setattr(cli, "load_target", lambda *a, **k: target)
    save_head(head, tmp_path / "head")
    return ["generate", "--prompt", "hello", "--budget", "fixed", "--max-new-tokens", "12",
            "--total-tokens", "4", "--depth", "2", "--top-k", "2", "--head", str(tmp_path / "head")]


def test_generate_appends_one_whole_trace_per_run(tiny_cli, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    for mode in ("dynamic", "static", "vanilla"):
        assert cli.main([*tiny_cli, "--mode", mode, "--trace", str(path)]) == 0
    traces, report = read_trace(path)
    assert [t.steps[0].mode for t in traces] == ["dynamic", "static", "vanilla"] and report.skipped_lines == 0
    assert len({t.header.generation for t in traces}) == 3 and report.interrupted == 0


def test_an_interrupted_generation_is_marked_and_analysis_says_so(tiny_cli, tmp_path, monkeypatch, capsys):
    real = decode.generate

    def interrupted(decoder, ids, on_step):
        def stop_at_third(record):
            on_step(record)
            if record.step == 2:
                raise KeyboardInterrupt
        return real(decoder, ids, stop_at_third)

    monkeypatch.setattr(decode, "generate", interrupted)
    path = tmp_path / "t.jsonl"
    assert cli.main([*tiny_cli, "--trace", str(path)]) == 130
    traces, report = read_trace(path)
    assert len(traces[0].steps) == 3 and traces[0].steps[-1].finished == INTERRUPTED
    assert traces[0].header.meta["interrupted"] is True and traces[0].interrupted and report.interrupted == 1
    _, messages = load_traces(path)
    assert any("interrupted before they finished" in m for m in messages)


@pytest.mark.parametrize("extra, message", [
    (["--trace", "/dev/full"], "/dev/full: No space left on device"),
    (["--trace", "{tmp}"], "is a directory"),
    (["--trace", "/proc/version/x"], "not writable"),
    (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "xpu"], "device"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--threads", "-1"], "--threads must be >= 1"),
    (["--seed", str(2 ** 70)], "--seed must be an integer from 0 to 2**63 - 1"),
    (["--seed", "-1"], "--seed must be"),
    (["--mode", "static", "--budget", "adaptive"], "--budget adaptive sizes dynamic trees only"),
    (["--mode", "vanilla", "--budget", "auto"], "--budget auto sizes dynamic trees only"),
    (["--prompt", "h\udcffi"], "is not valid UTF-8"),
    (["--head", "{tmp}/nohead"], "No draft head"),
])
def test_generate_bad_input_is_one_sentence(tiny_cli, tmp_path, capsys, extra, message):
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    assert cli.main([*tiny_cli, *extra]) == 2
    assert message in _one_sentence(capsys.readouterr().err)


def test_invalid_utf8_on_stdin_is_one_sentence(tiny_cli, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9")))
    args = [*tiny_cli]
    args[args.index("hello")] = "-"
    assert cli.main(args) == 2
    assert "the prompt on stdin is not valid UTF-8 (byte 3" in _one_sentence(capsys.readouterr().err)


def test_a_damaged_head_through_the_cli(tiny_cli, tmp_path, capsys):
    (tmp_path / "head" / "model.safetensors").write_bytes(b"half a file")
    assert cli.main(tiny_cli) == 2
    assert "model.safetensors is corrupt" in _one_sentence(capsys.readouterr().err)


def test_a_closed_pipe_ends_quietly(capsys):
    def write_to_closed_pipe() -> int:
        raise BrokenPipeError(32, "Broken pipe")
    assert run_guarded(write_to_closed_pipe) == 141
    assert capsys.readouterr().err == ""
