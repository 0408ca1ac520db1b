"""Bad input and long runs: clear errors, nothing lost, the cache never overflows; and issue 16's
integrity cases: concurrent writers, kill -9 of every resumable job, a corrupted-file matrix."""
import io
import json
import multiprocessing
import os
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

from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from analysis.__main__ import main as analysis_main
from analysis.export import load_traces
from eagle import cli
from eagle.training import commands, train
from eagle.training import features as shards
from eagle.tools.bench import command as bench_command
from eagle.core.config import DecodeConfig
from eagle.training.data import read_sharegpt
from eagle.core.decode import Decoder, generate
from eagle.core.prompt import PromptError
from eagle.training.distill import DistillConfig, regenerate
from eagle.training.store import OPEN_FILE, DistillStore, ReadStats
from eagle.records.files import BusyError, exclusive_lock, run_guarded
from eagle.models.head import new_head
from eagle.models.headio import COUNTS_FILE, head_sha256, load_head, save_head
from eagle.models.conversion import resolve_model_path
from eagle.models.loader import load_target
from eagle.models.location import DEFAULT_MODEL
from eagle.records.trace import (INTERRUPTED, NodeRecord, StepRecord, Trace, TraceFormatError, TraceHeader, append_trace,
                         read_trace, write_trace)
from tests.tiny import tiny_pair

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
@pytest.mark.slow
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
    path = tmp_path / "new" / "t.jsonl"  # a directory that does not exist yet is made
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


def test_a_version_2_trace_still_reads(tmp_path):
    """Version 2 decoded each round alone: its text fields (split characters, special tokens) read as written."""
    path = tmp_path / "t.jsonl"
    head, *steps = _lines(_finished_trace(3, writer="\ufffd<|im_end|>"))
    path.write_text("\n".join([json.dumps(json.loads(head) | {"version": 2}), *steps]) + "\n")
    traces, report = read_trace(path)
    assert [s.new_text for s in traces[0].steps] == ["\ufffd<|im_end|>"] * 3 and report.skipped_lines == 0


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
    "truncated weights": (lambda p: _cut(p / "model.safetensors", 900), "model.safetensors is corrupt"),
    "garbage weights": (lambda p: (p / "model.safetensors").write_bytes(b"\x00" * 64), "model.safetensors is corrupt"),
    "truncated token counts": (lambda p: (p / COUNTS_FILE).write_bytes(b"{}"), "token_counts.safetensors is corrupt"),
    "invalid JSON config": (lambda p: (p / "config.json").write_text('{"hidden_size": 32,'),
                            "config.json is not valid JSON"),
    "config not an object": (lambda p: (p / "config.json").write_text("[1, 2]"), "is not a JSON object"),
    "heads do not divide the hidden size": (lambda p: _edit_config(p, num_attention_heads=5, head_dim=None),
                                            "does not divide by num_attention_heads 5"),
    "kv heads do not divide the heads": (lambda p: _edit_config(p, num_key_value_heads=3), "num_key_value_heads 3"),
    "more heads than the weights have": (lambda p: _edit_config(p, num_attention_heads=8, head_dim=8),
                                         "weights do not match its config.json"),
    "intermediate size differs": (lambda p: _edit_config(p, intermediate_size=48),
                                  "weights do not match its config.json"),
    "hidden size differs from the target": (lambda p: _edit_config(p, hidden_size=16), "hidden_size 16 but the target"),
    "corrupt pytorch_model.bin": (lambda p: ((p / "model.safetensors").unlink(),
                                             (p / "pytorch_model.bin").write_bytes(b"PK")),
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


def test_the_head_hash_sees_every_weight_and_the_token_counts(tmp_path):
    target, head = tiny_pair()
    save_head(head, tmp_path / "h", dtype=torch.float32)
    same = head_sha256(load_head(tmp_path / "h", target))
    assert same == head_sha256(head)
    head.layers[0].mlp.down_proj.weight.data[0, 0] += 1  # fc untouched: the old cache key would not see it
    assert head_sha256(head) != same
    _, other = tiny_pair()
    other.token_counts[3] += 1
    assert head_sha256(other) != same


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
    names = sorted(p.name for p in (tmp_path / "h").iterdir())
    assert names == sorted([COUNTS_FILE, "config.json", "model.safetensors"])  # no temporary left behind
    target, _ = tiny_pair()
    assert int(load_head(tmp_path / "h", target).token_counts.sum()) == 12


def test_interleaved_generations_with_ids_come_apart(tmp_path):
    """Lines of two generations mixed one by one (a file concatenated by hand, an old writer): the
    generation id on every record gives each step back to its own trace."""
    la, lb = _lines(_finished_trace(4, "A")), _lines(_finished_trace(3, "B"))
    mixed = [la[0], lb[0]] + [x for pair in zip(la[1:], lb[1:]) for x in pair] + la[len(lb):]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(mixed) + "\n")
    traces, report = read_trace(path)
    assert [(t.header.meta["writer"], [s.step for s in t.steps]) for t in traces] == [("A", [0, 1, 2, 3]),
                                                                                     ("B", [0, 1, 2])]
    assert report.skipped_lines == 0 and report.dropped_traces == 0 and report.interrupted == 0
    assert all({s.new_text for s in t.steps} == {t.header.meta["writer"]} for t in traces)


def test_a_rewritten_version_1_trace_still_reads(tmp_path):
    """A version-1 trace read (no id) and written again carries an empty id on every record."""
    v1 = tmp_path / "v1.jsonl"
    v1.write_text("\n".join(_lines(_finished_trace(3), with_ids=False)) + "\n")
    again = tmp_path / "again.jsonl"
    write_trace(again, read_trace(v1)[0])
    traces, report = read_trace(again)
    assert [s.step for s in traces[0].steps] == [0, 1, 2] and report.skipped_lines == 0


# ---- a tiny model on disk: the real tokenizer, a 2-layer 32-wide Llama --------------------------
# Loaded through the same code as any local model (eagle.models.loader.load_target), so every command runs
# unchanged, in-process or as a subprocess that a test kills.
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(DEFAULT_MODEL))  # converted once per run
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_target(tiny_dir):
    return load_target(str(tiny_dir), dtype="float32")


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def _eagle(*args: str) -> subprocess.Popen:
    # An xdist worker may ignore SIGINT, and an ignored signal stays ignored in its children (Python then
    # installs no KeyboardInterrupt handler): give the CLI the default disposition a user's shell gives it.
    return subprocess.Popen([sys.executable, "-m", "eagle", *args], cwd=ROOT, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# A job run in a subprocess that SIGKILLs itself in the middle of its work: at the n-th forward of
# the target (prepare, distill) or the n-th optimizer step (train). Nothing in eagle knows of it.
KILLED_JOB = """
import json, os, signal, sys
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from eagle.training.distill import DistillConfig, regenerate
from eagle.training.data import read_sharegpt
from eagle.models.loader import load_target
from eagle.training.features import prepare_features
from eagle.training.train import train_head
job, model, kill_at, kw = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
torch.set_num_threads(1)
target = load_target(model, dtype="float32")
count = [0]
def hook(*_):
    count[0] += 1
    if count[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
if job == "train":
    register_optimizer_step_post_hook(hook)
    train_head(target, **kw)
else:
    target.model.model.norm.register_forward_hook(hook)
if job == "prepare":
    prepare_features(target, **kw)
if job == "distill":
    cfg = DistillConfig(**kw.pop("cfg"))
    regenerate(target, read_sharegpt(limit=kw.pop("n"))[0], cfg=cfg, progress=False, **kw)
"""


def _killed(job: str, model: Path, kill_at: int, **kw) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLED_JOB, job, str(model), str(kill_at), json.dumps(kw)],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


# ---- prepare: kill -9, a changed setting, damaged features -------------------------------------
PREPARE = dict(n_conversations=10, max_len=48, heldout_fraction=0.3, shard_size=1)


def _shards(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*-[0-9]*.safetensors"))}


@pytest.fixture(scope="module")
def tiny_features(tiny_target, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("features")
    shards.prepare_features(tiny_target, path, **PREPARE)
    return path


@pytest.mark.slow
def test_prepare_killed_mid_run_resumes_to_the_same_shards(tiny_dir, tiny_target, tiny_features, tmp_path):
    out = tmp_path / "features"
    _killed("prepare", tiny_dir, 5, out_dir=str(out), **PREPARE)
    assert 0 < len(_shards(out)) < len(_shards(tiny_features))
    # the settings were recorded before the first shard: another --max-len is refused, not mixed in
    with pytest.raises(ValueError, match=r"max_len=48 \(this run: 64\)"):
        shards.prepare_features(tiny_target, out, **{**PREPARE, "max_len": 64})
    with pytest.raises(ValueError, match="is incomplete"):  # train refuses a half-prepared directory
        shards.check_features(out)
    stats = shards.prepare_features(tiny_target, out, **PREPARE)
    assert stats.shards_skipped == 4 and _shards(out) == _shards(tiny_features)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest == {**json.loads((tiny_features / "manifest.json").read_text()), "stats": manifest["stats"]}


def test_a_second_prepare_on_one_features_dir_is_busy(tiny_target, tmp_path):
    with exclusive_lock(tmp_path / ".lock", "test"):
        with pytest.raises(BusyError, match="is in use by another run"):
            shards.prepare_features(tiny_target, tmp_path, **PREPARE)


def test_prepare_extracts_a_damaged_shard_again(tiny_target, tiny_features, tmp_path):
    out = tmp_path / "features"
    shards.prepare_features(tiny_target, out, **PREPARE)
    shard = sorted(out.glob("train-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:100])  # damaged after it was written (a bad copy, a bad disk)
    stats = shards.prepare_features(tiny_target, out, **PREPARE)
    assert stats.shards_written == 1 and _shards(out) == _shards(tiny_features)


def _train_args(features: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--features", str(features), "--out", str(out), "--steps", "2", "--batch", "2",
            "--warmup", "1", "--vocab-k", "64", "--eval-samples", "2", "--dtype", "float32", *extra]


FEATURE_DAMAGE = {
    "truncated shard": (lambda d: _cut(sorted(d.glob("train-*"))[0], 200), "is corrupt or incomplete"),
    "garbage shard": (lambda d: sorted(d.glob("train-*"))[0].write_bytes(b"\x00" * 40), "is corrupt or incomplete"),
    "shard without features": (lambda d: save_file({"input_ids": torch.zeros(3, dtype=torch.int32)},
                                                   str(sorted(d.glob("train-*"))[0])), "is not a feature shard"),
    "manifest not JSON": (lambda d: (d / "manifest.json").write_text("{"), "manifest.json is not valid JSON"),
    "prepare never finished": (lambda d: _edit_json(d / "manifest.json", stats=None), "is incomplete"),
    "token counts torn": (lambda d: _cut(d / COUNTS_FILE, 10), "token_counts.safetensors is corrupt"),
    "no shards at all": (lambda d: [p.unlink() for p in d.glob("train-*")], "No train-*.safetensors shards"),
}


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _edit_json(path: Path, **changes) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps({k: v for k, v in obj.items() if v is not None}))


@pytest.mark.parametrize("damage", sorted(FEATURE_DAMAGE))
def test_damaged_features_are_one_sentence(tiny_dir, tiny_features, tmp_path, capsys, damage):
    features = tmp_path / "features"
    features.mkdir()
    for p in tiny_features.iterdir():
        if p.is_file():
            (features / p.name).write_bytes(p.read_bytes())
    corrupt, message = FEATURE_DAMAGE[damage]
    corrupt(features)
    assert commands.main([*_train_args(features, tmp_path / "run"), "--model", str(tiny_dir)]) == 2
    assert message in _one_sentence(capsys.readouterr().err)


def test_an_eagle3_run_on_eagle1_features_is_one_sentence(tiny_dir, tiny_features, tmp_path, capsys):
    """EAGLE-1 features lack the three fused layers an EAGLE-3 head reads (the reverse works: see test_eagle3)."""
    args = _train_args(tiny_features, tmp_path / "run", "--head-type", "eagle3", "--loss", "token")
    assert commands.main([*args, "--model", str(tiny_dir)]) == 2
    assert "prepared for head_type eagle1" in _one_sentence(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


# ---- train: kill -9, a changed recipe or data, a head already there ----------------------------
TRAIN = dict(steps=6, lr=1e-3, batch=2, warmup=1, vocab_k=64, eval_samples=2, eval_every=0, checkpoint_every=2,
             progress=False)


def _weights(head_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(str(head_dir / "model.safetensors"))


@pytest.mark.slow
def test_train_killed_mid_run_resumes_to_the_same_head(tiny_dir, tiny_target, tiny_features, tmp_path):
    reference = train.train_head(tiny_target, tiny_features, tmp_path / "ref", **TRAIN)
    out = tmp_path / "run"
    _killed("train", tiny_dir, 5, features_dir=str(tiny_features), out_dir=str(out), **TRAIN)
    assert (out / "checkpoint.pt").exists() and not (out / "head").exists()
    resumed = train.train_head(tiny_target, tiny_features, out, **TRAIN)
    assert resumed["start_step"] == 4 and resumed["steps"] == reference["steps"] == 6
    ref, got = _weights(tmp_path / "ref" / "head"), _weights(out / "head")
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


def test_evaluate_scores_a_saved_head_as_train_did(tiny_dir, tiny_target, tiny_features, tmp_path, capsys):
    summary = train.train_head(tiny_target, tiny_features, tmp_path / "run", **TRAIN)
    out = tmp_path / "metrics.json"
    args = ["evaluate", "--head", str(tmp_path / "run" / "head"), "--features", str(tiny_features), "--batch", "2",
            "--vocab-k", "64", "--json", str(out), "--model", str(tiny_dir), "--dtype", "float32"]
    assert commands.main(args) == 0
    got = json.loads(out.read_text())
    assert got == json.loads(capsys.readouterr().out)
    assert got["heldout_samples"] == summary["heldout_samples"] and got["positions"] == summary["heldout"]["positions"]
    for key in ("top1", "acc_step2", "acc_step4", "ce", "ce_full"):
        assert got[key] == pytest.approx(summary["heldout"][key], rel=1e-5), key  # fp32 sums in another order
    assert commands.main(args) == 2  # the metrics file is not overwritten
    assert "already exists" in _one_sentence(capsys.readouterr().err)
    assert commands.main([*args[:2], str(tmp_path), *args[3:-6]]) == 2
    assert "no head there" in _one_sentence(capsys.readouterr().err)


@pytest.mark.parametrize("change, field", [({"lr": 2e-3}, "lr=0.001 (this run: 0.002)"),
                                           ({"features": "other"}, "features="), ({"seed": 1}, "seed=0")])
def test_train_resume_with_another_recipe_or_data_is_refused(tiny_target, tiny_features, tmp_path, change, field):
    features = tiny_features
    if "features" in change:
        features = tmp_path / "other"
        features.mkdir()
        for p in tiny_features.iterdir():
            if p.is_file():
                (features / p.name).write_bytes(p.read_bytes())
    kw = {**TRAIN, "steps": 2, **{k: v for k, v in change.items() if k != "features"}}
    train.train_head(tiny_target, tiny_features, tmp_path / "run", **{**TRAIN, "steps": 2})
    with pytest.raises(ValueError, match=field.replace("(", r"\(").replace(")", r"\)")):
        train.train_head(tiny_target, features, tmp_path / "run", **kw)


def test_train_keeps_a_head_in_final_dir_unless_told(tiny_dir, tiny_features, tmp_path, capsys):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    args = [*_train_args(tiny_features, tmp_path / "run", "--final-dir", str(tmp_path / "final")),
            "--model", str(tiny_dir)]
    assert commands.main(args) == 2
    assert "already holds a head: pass --overwrite" in _one_sentence(capsys.readouterr().err)
    assert (tmp_path / "final" / "config.json").read_text() == "{}"
    assert commands.main([*args, "--overwrite"]) == 0
    assert (tmp_path / "final" / "model.safetensors").exists()


def test_sharegpt_with_invalid_utf8_is_one_sentence(tiny_dir, tmp_path, capsys):
    bad = tmp_path / "sg.json"
    bad.write_bytes(b'[{"id": "x", "conversations": [{"from": "human", "value": "caf\xe9"}]}]')
    assert commands.main(["prepare", "--sharegpt", str(bad), "--features", str(tmp_path / "f"), "--model",
                       str(tiny_dir), "--dtype", "float32"]) == 2
    assert f"{bad} is not valid UTF-8" in _one_sentence(capsys.readouterr().err)


def test_a_damaged_checkpoint_is_one_sentence(tiny_dir, tiny_features, tmp_path, capsys):
    args = [*_train_args(tiny_features, tmp_path / "run"), "--model", str(tiny_dir)]
    assert commands.main(args) == 0
    _cut(tmp_path / "run" / "checkpoint.pt", 300)
    assert commands.main([*args, "--steps", "3"]) == 2
    assert "checkpoint.pt cannot be resumed from" in _one_sentence(capsys.readouterr().err)


@pytest.mark.parametrize("args, message", [
    (["train", "--features", "{tmp}/none"], "No train-*.safetensors shards in"),
    (["prepare", "--sharegpt", "{tmp}/none.json", "--features", "{tmp}/f"], "--sharegpt {tmp}/none.json: no such file"),
    (["prepare", "--features", "{tmp}/file"], "is a file, not a directory"),
    (["train", "--threads", "-1"], "--threads must be >= 1"),
    (["prepare", "--seed", str(2 ** 70)], "--seed must be an integer"),
    (["prepare", "--conversations", "10", "--first-conversation", "10"],
     "--first-conversation 10: must be at least 0 and below --conversations (10)"),
    (["distill", "--device", "tpu"], "unknown device 'tpu'"),
])
def test_prepare_train_distill_bad_input_before_any_model_loads(tmp_path, capsys, args, message):
    (tmp_path / "file").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    # --model names no model at all: the check must fail first, or the load would
    assert commands.main([*args, "--model", str(tmp_path / "no-model")]) == 2
    assert message.replace("{tmp}", str(tmp_path)) in _one_sentence(capsys.readouterr().err)


# ---- distill: kill -9 and damaged store files ---------------------------------------------------
DISTILL = dict(cfg=dict(max_new_tokens=6, max_prompt_tokens=200, batch_size=2), n=6, window=2)


def _records(store: Path) -> dict[int, dict]:
    return {r["id"]: r for r in DistillStore.open(store).records()}


@pytest.mark.slow
def test_distill_killed_mid_run_resumes_to_the_same_replies(tiny_dir, tiny_target, tmp_path):
    convs = read_sharegpt(limit=DISTILL["n"])[0]
    cfg = DistillConfig(**DISTILL["cfg"])
    regenerate(tiny_target, convs, tmp_path / "ref", cfg, progress=False, window=DISTILL["window"])
    out = tmp_path / "store"
    _killed("distill", tiny_dir, 8, store_dir=str(out), **json.loads(json.dumps(DISTILL)))
    assert (out / "manifest.json").exists() and len(_records(out)) < len(_records(tmp_path / "ref"))
    stats = regenerate(tiny_target, convs, out, cfg, progress=False, window=DISTILL["window"])
    assert stats.already_done > 0 or stats.regenerated < len(convs)
    assert _records(out) == _records(tmp_path / "ref")


DISTILL_DAMAGE = {
    "manifest not JSON": (lambda d: (d / "manifest.json").write_text('{"format": '), "is not valid JSON"),
    "not a distill manifest": (lambda d: (d / "manifest.json").write_text("{}"), "is not a self-distillation manifest"),
    "chunk edited": (lambda d: _cut(next(d.glob("chunk-*")), 30), "does not match its manifest hash"),
    "chunk missing": (lambda d: next(d.glob("chunk-*")).unlink(), "chunk-00000.jsonl.gz"),
}


@pytest.mark.parametrize("damage", sorted(DISTILL_DAMAGE))
def test_damaged_distill_store_is_one_sentence(tiny_target, tmp_path, damage):
    convs = read_sharegpt(limit=4)[0]
    regenerate(tiny_target, convs, tmp_path, DistillConfig(**DISTILL["cfg"]), progress=False, window=2)
    corrupt, message = DISTILL_DAMAGE[damage]
    corrupt(tmp_path)
    with pytest.raises((ValueError, OSError)) as err:
        DistillStore.open(tmp_path).records()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_distill_open_file_bad_lines_are_skipped_and_counted(tmp_path):
    """A blank and a bad line in the middle of open.jsonl cost only themselves; a torn tail is cut."""
    store = DistillStore.open(tmp_path, {"model": "m", "target_sha256": "x", "max_new_tokens": 1,
                                         "max_prompt_tokens": 1, "temperature": 0.0, "seed": 0})
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    records = [{"id": i, "conversations": turns, "truncated": False, "new_tokens": 1} for i in range(4)]
    lines = [json.dumps(records[0]), "", "{not json", *map(json.dumps, records[1:])]
    (tmp_path / OPEN_FILE).write_text("\n".join(lines) + '\n{"id": 9, "conv')
    stats = ReadStats()
    assert sorted(store.read_open(stats)) == [0, 1, 2, 3] and stats.bad_lines == 1 and stats.torn_tail


# ---- bench: one lock per --out, kill -9, what a resume may reuse -------------------------------
def _questions(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"question_id": i + 1, "category": "c", "turns": [t]}) + "\n"
                            for i, t in enumerate(texts)))
    return path


QUESTIONS = ["Name three colours.", "What is a prime number?", "Say hello in French."]


def _bench_args(model: Path, dataset: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--dataset", str(dataset), "--dtype", "float32", "--modes", "vanilla,dynamic",
            "--baselines", "same", "--head", "random", "--budget", "fixed", "--total-tokens", "4", "--depth", "2", "--top-k", "2",
            "--max-new-tokens", "24", "--out", str(out), "--json", *extra]


def _stored(out: Path) -> dict[tuple, list[int]]:
    """(mode file, question) -> the tokens, checking that no finished generation is stored twice."""
    found: dict[tuple, list[int]] = {}
    for path in sorted((out / "traces").glob("*.jsonl")):
        for t in read_trace(path)[0]:
            if not t.interrupted and "mode_label" in t.header.meta:
                key = (path.name, t.header.meta["question_id"], t.header.meta["turn"])
                assert key not in found, f"{key} stored twice"
                found[key] = [tok for s in t.steps for tok in s.new_tokens]
    return found


@pytest.fixture(scope="module")
def bench_reference(tiny_dir, tmp_path_factory) -> dict[tuple, list[int]]:
    root = tmp_path_factory.mktemp("bench-ref")
    assert bench_command.main(_bench_args(tiny_dir, _questions(root / "q.jsonl", QUESTIONS), root / "out")) == 0
    return _stored(root / "out")


@pytest.mark.slow
def test_two_bench_runs_on_one_out_never_do_the_work_twice(tiny_dir, bench_reference, tmp_path):
    dataset = _questions(tmp_path / "q.jsonl", QUESTIONS)
    procs = [_eagle("bench", *_bench_args(tiny_dir, dataset, tmp_path / "out")) for _ in range(2)]
    results = [(p.wait(300), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc == 0 or (rc == 2 and "is in use by another run" in _one_sentence(err)), err[-2000:]
    assert 0 in [rc for rc, _ in results] and _stored(tmp_path / "out") == bench_reference


@pytest.mark.slow
def test_bench_killed_mid_run_resumes_to_the_same_results(tiny_dir, bench_reference, tmp_path):
    dataset, out = _questions(tmp_path / "q.jsonl", QUESTIONS), tmp_path / "out"
    proc = _eagle("bench", *_bench_args(tiny_dir, dataset, out))
    vanilla = out / "traces" / "vanilla.jsonl"
    while proc.poll() is None and not (vanilla.exists() and vanilla.stat().st_size):
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    assert bench_command.main(_bench_args(tiny_dir, dataset, out)) == 0
    assert _stored(out) == bench_reference


def test_bench_resume_refuses_another_head_question_or_setting(tiny_dir, tiny_target, tmp_path, capsys):
    dataset, out = _questions(tmp_path / "q.jsonl", QUESTIONS), tmp_path / "out"
    assert bench_command.main(_bench_args(tiny_dir, dataset, out)) == 0
    save_head(new_head(tiny_target, seed=9), tmp_path / "head")
    capsys.readouterr()
    assert bench_command.main([*_bench_args(tiny_dir, dataset, out), "--head", str(tmp_path / "head")]) == 2
    assert "was made with another draft head" in _one_sentence(capsys.readouterr().err)
    edited = _questions(tmp_path / "edited.jsonl", [QUESTIONS[0], "What is a composite number?", QUESTIONS[2]])
    assert bench_command.main(_bench_args(tiny_dir, edited, out)) == 2
    assert "(question 2, turn 1) answers another question text" in _one_sentence(capsys.readouterr().err)
    assert bench_command.main([*_bench_args(tiny_dir, dataset, out), "--max-new-tokens", "25"]) == 2
    assert "was made with max_new_tokens=24 (this run: 25)" in _one_sentence(capsys.readouterr().err)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["head"] == "random" and summary["generations"] == 6  # the refused runs changed nothing


def test_bench_keeps_what_it_did_not_write(tiny_dir, bench_reference, tmp_path, capsys):
    dataset, out = _questions(tmp_path / "q.jsonl", QUESTIONS), tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    assert bench_command.main(_bench_args(tiny_dir, dataset, out)) == 2
    assert "was not written by bench" in _one_sentence(capsys.readouterr().err)
    assert (out / "summary.json").read_text() == '{"mine": 1}'
    assert bench_command.main([*_bench_args(tiny_dir, dataset, out), "--overwrite"]) == 0
    foreign = _finished_trace(3, "mine")  # a generate trace, no bench metadata, in a mode file
    append_trace(out / "traces" / "vanilla.jsonl", foreign)
    assert bench_command.main(_bench_args(tiny_dir, dataset, out)) == 0
    kept = [t for t in read_trace(out / "traces" / "vanilla.jsonl")[0] if t.header.meta.get("writer") == "mine"]
    assert len(kept) == 1 and len(kept[0].steps) == 3 and _stored(out) == bench_reference


@pytest.mark.parametrize("extra, message", [
    (["--out", "{tmp}/file"], "is a file, not a directory"),
    (["--threads", "-1"], "--threads must be >= 1"),
    (["--budget", "adaptive"], "name the mode dynamic:adaptive"),
    (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "xpu"], "device"),
    (["--seed", str(2 ** 70)], "--seed must be an integer"),
])
def test_bench_bad_input_before_any_model_loads(tmp_path, capsys, extra, message):
    (tmp_path / "file").write_text("x")
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    dataset = _questions(tmp_path / "q.jsonl", QUESTIONS)
    assert bench_command.main([*_bench_args(tmp_path / "no-model", dataset, tmp_path / "out"), *extra]) == 2
    assert message in _one_sentence(capsys.readouterr().err)
    assert (tmp_path / "file").read_text() == "x"


# ---- generate: the error boundary, the trace, interruption -------------------------------------
@pytest.fixture
def tiny_cli(tiny_dir, tiny_target, tmp_path):
    save_head(new_head(tiny_target, seed=1), tmp_path / "head")
    return ["generate", "--model", str(tiny_dir), "--dtype", "float32", "--prompt", "hello", "--budget", "fixed",
            "--max-new-tokens", "12", "--total-tokens", "4", "--depth", "2", "--top-k", "2",
            "--head", str(tmp_path / "head")]


def test_generate_appends_one_whole_trace_per_run(tiny_cli, tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    for mode in ("dynamic", "static", "vanilla"):
        assert cli.main([*tiny_cli, "--mode", mode, "--trace", str(path)]) == 0
    traces, report = read_trace(path)
    assert [t.steps[0].mode for t in traces] == ["dynamic", "static", "vanilla"] and report.skipped_lines == 0
    assert len({t.header.generation for t in traces}) == 3 and report.interrupted == 0


@pytest.mark.slow
def test_two_generate_runs_on_one_trace_never_mix(tiny_cli, tmp_path):
    path = tmp_path / "t.jsonl"
    procs = [_eagle(*tiny_cli, "--mode", mode, "--max-new-tokens", "300", "--trace", str(path))
             for mode in ("vanilla", "dynamic")]
    assert [p.wait(300) for p in procs] == [0, 0]
    traces, report = read_trace(path)
    assert sorted(t.header.config["mode"] for t in traces) == ["dynamic", "vanilla"]
    assert report.skipped_lines == 0 and report.dropped_traces == 0 and report.interrupted == 0
    for t in traces:
        assert [s.step for s in t.steps] == list(range(len(t.steps))) and {s.mode for s in t.steps} == {
            t.header.config["mode"]}
        assert sum(len(s.new_tokens) for s in t.steps) == 300


@pytest.mark.slow
def test_an_interrupted_generation_is_marked_and_analysis_says_so(tiny_cli, tmp_path):
    path = tmp_path / "t.jsonl"
    args = [*tiny_cli, "--max-new-tokens", "1900", "--trace", str(path)]
    # The tiny model can finish before the signal lands (its first printable text may come late, and under
    # a parallel suite it did, three times in a row, with 1500 tokens): try again, with longer runs.
    for _ in range(5):
        path.unlink(missing_ok=True)
        proc = _eagle(*args)
        proc.stdout.read(1)  # the prefill token is out: the generation is under way
        proc.send_signal(signal.SIGINT)
        code = proc.wait(120)
        if code != 0:
            break
    assert code == 130 and "Traceback" not in proc.stderr.read()
    traces, report = read_trace(path)
    assert traces[0].steps[-1].finished == INTERRUPTED and 1 <= len(traces[0].steps) < 1900
    assert traces[0].header.meta["interrupted"] is True and traces[0].interrupted and report.interrupted == 1
    _, messages = load_traces(path)
    assert any("interrupted before they finished" in m for m in messages)


@pytest.mark.slow
def test_output_into_a_closed_pipe_ends_quietly(tiny_cli):
    proc = _eagle(*tiny_cli, "--max-new-tokens", "800", "--mode", "vanilla")
    proc.stdout.read(1)
    proc.stdout.close()  # what `| head -c 1` does
    err = proc.stderr.read()
    assert proc.wait(120) == 141 and "Traceback" not in err and "error" not in err.lower()


@pytest.mark.parametrize("extra, message", [
    (["--trace", "/dev/full"], "/dev/full: No space left on device"),
    (["--trace", "{tmp}"], "is a directory"),
    (["--trace", "/proc/version/x"], "/proc/version is not a directory"),
    (["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "xpu"], "device"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--threads", "-1"], "--threads must be >= 1"),
    (["--seed", str(2 ** 70)], "--seed must be an integer from 0 to 2**63 - 1"),
    (["--seed", "-1"], "--seed must be"),
    (["--mode", "static", "--budget", "adaptive"], "--budget adaptive sizes dynamic trees only"),
    (["--mode", "vanilla", "--budget", "auto"], "--budget auto sizes dynamic trees only"),
    (["--prompt", "h\udcffi"], "is not valid UTF-8"),
    (["--head", "{tmp}/nohead"], "No draft head"),
    (["--model", "{tmp}/no-such-model"], "No model directory at"),
    (["--model", "{tmp}/head"], "has no tokenizer"),
    (["--model", "someone/no-such-model-here"], "'someone/no-such-model-here'"),
])
def test_generate_bad_input_is_one_sentence(tiny_cli, tmp_path, capsys, extra, message):
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    assert cli.main([*tiny_cli, *extra]) == 2
    assert message in _one_sentence(capsys.readouterr().err)


@pytest.mark.parametrize("damage, message", [
    (lambda c: c.update(num_attention_heads=5), "is not a multiple of the number of attention heads (5)"),
    (None, "config.json' is not a valid JSON file"),
])
def test_a_model_dir_with_a_bad_config_is_one_sentence(tiny_cli, tiny_dir, tmp_path, capsys, damage, message):
    model = tmp_path / "model"
    model.mkdir()
    for p in tiny_dir.iterdir():
        (model / p.name).write_bytes(p.read_bytes())
    config = json.loads((model / "config.json").read_text())
    if damage is not None:
        damage(config)
    (model / "config.json").write_text("{" if damage is None else json.dumps(config))
    assert cli.main([*tiny_cli, "--model", str(model)]) == 2
    sentence = _one_sentence(capsys.readouterr().err)
    assert f"Could not load model '{model}'" in sentence and message in sentence


# Message-only checks run in-process (cli.main is `python -m eagle` without the interpreter start): eagle
# reads HF_HUB_OFFLINE and the prompt's bytes at each call.
def test_an_unknown_hub_id_offline_fails_at_once(tiny_cli, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    t0 = time.monotonic()
    assert cli.main([*tiny_cli, "--model", "someone/no-such-model-here"]) == 2
    assert time.monotonic() - t0 < 30  # no retries: the 52 s
    assert "'someone/no-such-model-here'" in _one_sentence(capsys.readouterr().err)  # (online: the hub's answer)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main([*tiny_cli, "--model", "someone/no-such-model-here"]) == 2
    assert "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in _one_sentence(capsys.readouterr().err)


def test_invalid_utf8_on_stdin_and_argv_is_one_sentence(tiny_cli, monkeypatch, capsys):
    args = [*tiny_cli]
    args[args.index("hello")] = "-"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"caf\xe9")))
    assert cli.main(args) == 2
    assert "the prompt on stdin is not valid UTF-8 (byte 3" in _one_sentence(capsys.readouterr().err)
    args = [*tiny_cli]
    args[args.index("hello")] = os.fsdecode(b"caf\xe9")  # what Python makes of those bytes in sys.argv
    assert cli.main(args) == 2
    assert "is not valid UTF-8" in _one_sentence(capsys.readouterr().err)


def test_a_damaged_head_through_the_cli(tiny_cli, tmp_path, capsys):
    (tmp_path / "head" / "model.safetensors").write_bytes(b"half a file")
    assert cli.main(tiny_cli) == 2
    assert "model.safetensors is corrupt" in _one_sentence(capsys.readouterr().err)


@pytest.mark.parametrize("args, message", [
    (["budget", "--threads", "0"], "--threads must be >= 1"),
    (["budget", "--device", "tpu"], "unknown device 'tpu'"),
    (["generate", "--prompt", "x", "--trace", "/dev/null/t"], "is not a directory"),
])
def test_budget_and_generate_check_flags_before_any_model_loads(tmp_path, capsys, args, message):
    assert cli.main([*args, "--model", str(tmp_path / "no-model")]) == 2
    assert message in _one_sentence(capsys.readouterr().err)


def test_a_closed_pipe_ends_quietly(capsys):
    def write_to_closed_pipe() -> int:
        raise BrokenPipeError(32, "Broken pipe")
    assert run_guarded(write_to_closed_pipe) == 141
    assert capsys.readouterr().err == ""


# ---- analysis: damaged traces and a wrong --out ------------------------------------------------
def test_analysis_skips_damaged_steps_and_refuses_a_file_as_out(tmp_path, capsys):
    lines = _lines(_finished_trace(4, "A"))
    bad = json.loads(lines[2])
    bad["nodes"][0]["confidence"] = None
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join([*lines[:2], json.dumps(bad), *lines[3:]]) + "\n")
    traces, messages = load_traces(path)
    assert [len(t.steps) for t in traces] == [3] and any("skipped 1 bad line" in m for m in messages)
    assert analysis_main(["figures", "--traces", str(path), "--out", str(tmp_path / "figs"), "--formats", ""]) == 0
    assert "skipped 1 bad line(s) in all; first: line 3: step 1 node field 'confidence' is None" \
        in capsys.readouterr().err
    assert (tmp_path / "figs" / "steps.csv").stat().st_size > 0
    (tmp_path / "file").write_text("x")
    assert analysis_main(["figures", "--traces", str(path), "--out", str(tmp_path / "file")]) == 2
    assert "is a file, not a directory" in _one_sentence(capsys.readouterr().err)
    (tmp_path / "junk.jsonl").write_text("nope\n")
    assert analysis_main(["figures", "--traces", str(tmp_path / "junk.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "no readable trace" in _one_sentence(capsys.readouterr().err)
