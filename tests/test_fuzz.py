"""Every file format the product reads, fuzzed (issue 36): valid files built from tiny models and tiny
data are mutated (a field dropped, retyped, wrapped in the wrong nesting, shrunk, pushed out of range, the
file truncated) and each reader must either read the file or raise eagle.records.schema.FileFormatError, never
anything else, and whatever it returns must be usable (ids in the vocabulary, widths the model's, ...).
Line files (traces, open.jsonl) skip and count a bad line instead; caches (costs, auto reports) are
measured again (None)."""
from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import json
import math
import operator
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from app.benchmarks import measured_auto_speedup
from app.sources import read_files
from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.models.head import HEAD_KINDS, new_head
from eagle.models.headio import COUNTS_FILE, load_head, save_head
from eagle.records.schema import FileFormatError
from eagle.tools.budget import costs as budget_costs, report as budget_report
from eagle.records.timing import measured_under_load
from eagle.tools.bench.report import read_summary
from eagle.tools.bench.store import Expected, load_store
from eagle.tools.bench.specbench import answer_records, mean_speed, read_answers
from eagle.records.trace import Trace, TraceHeader, _parse, read_trace, write_trace
from eagle.training.distill import read_distilled
from eagle.training.features import MANIFEST, _write_shard, check_features, load_shards
from eagle.training.store import MANIFEST as STORE_MANIFEST
from eagle.training.store import OPEN_FILE, DistillStore, ReadStats, check_record
from tests.tiny import tiny_target

# 25 examples per format keep the file to well under a minute; EAGLE_FUZZ_EXAMPLES=500 searches deeper.
FUZZ = settings(max_examples=int(os.environ.get("EAGLE_FUZZ_EXAMPLES", 25)), deadline=None,
                suppress_health_check=list(HealthCheck))
VOCAB, HIDDEN = 12, 32  # tests.tiny's model

# ---- mutations ----------------------------------------------------------------------------------
JUNK = (None, True, -1, 10**12, 0.5, math.nan, math.inf, "", "x", [], {}, [None], {"x": None})


def _paths(obj: object, at: tuple = ()) -> list[tuple]:
    """Every place inside a JSON value: keys of objects and indices of lists, at any depth."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    out = []
    for key, value in items:
        out += [at + (key,), *_paths(value, at + (key,))]
    return out


def _out_of_range(value: object, draw) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return draw(st.sampled_from(JUNK))
    return draw(st.sampled_from((-1 - value, value + 10**6, -value * 0.5 - 0.5, math.nan)))


@st.composite
def mutated(draw, obj: object) -> object:
    """`obj` with one mutation somewhere inside it (or at its root: the wrong nesting)."""
    obj = copy.deepcopy(obj)
    paths = _paths(obj)
    op = draw(st.sampled_from(("drop", "retype", "wrap", "shrink", "range", "range", "root")))
    if op == "root" or not paths:
        return draw(st.sampled_from((*JUNK, [obj])))
    path = draw(st.sampled_from(paths))
    parent = functools.reduce(operator.getitem, path[:-1], obj)
    value = parent[path[-1]]
    if op == "drop":
        del parent[path[-1]]
    elif op == "retype":
        parent[path[-1]] = draw(st.sampled_from(JUNK))
    elif op == "wrap":
        parent[path[-1]] = [value] if draw(st.booleans()) else {"value": value}
    elif op == "shrink" and isinstance(value, (list, str, dict)):
        parent[path[-1]] = type(value)(list(value.items())[:len(value) // 2]) if isinstance(value, dict) \
            else value[:len(value) // 2]
    else:
        parent[path[-1]] = _out_of_range(value, draw)
    return obj


@st.composite
def truncated(draw, data: bytes) -> bytes:
    return data[:draw(st.integers(0, max(0, len(data) - 1)))]


def dumps(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False)  # NaN and infinity as Python writes them: readers must cope


# ---- valid files from tiny models ---------------------------------------------------------------
@functools.cache
def _pair():
    target = tiny_target(vocab=VOCAB, seed=3, eos=None, layers=6)  # six layers: an EAGLE-3 head fits too
    return target, new_head(target, seed=4)


@functools.cache
def _traces() -> tuple[Trace, ...]:
    """Two real generations of the tiny pair, as bench stores them (header meta for resume)."""
    target, head = _pair()
    out = []
    for turn, prompt in ((1, [1, 2, 3]), (2, [4, 5])):
        cfg = DecodeConfig(mode="dynamic", max_new_tokens=4, total_tokens=6, depth=2, top_k=2)
        g = generate(Decoder(target, head, cfg), prompt)
        meta = {"question_id": 81, "category": "writing", "turn": turn, "mode_label": "dynamic",
                "seconds": 0.25, "new_tokens": len(g.tokens), "head_sha": "h",
                "messages": [{"role": "user", "content": "q"}]}
        out.append(Trace(TraceHeader(target.name, "random", asdict(cfg), "q", len(prompt), meta), g.steps))
    return tuple(out)


def _trace_lines() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        write_trace(Path(tmp) / "t.jsonl", _traces())
        return (Path(tmp) / "t.jsonl").read_text(encoding="utf-8").splitlines()


def _line_is_valid(line: str) -> bool:
    try:
        _parse(line)
    except (ValueError, TypeError, KeyError):
        return False
    return True


# ---- traces (generate --trace, bench, analysis) and traces uploaded in the dashboard ------------------
@FUZZ
@given(data=st.data())
def test_trace_reader_skips_and_counts_a_malformed_record(data) -> None:
    lines = _trace_lines()
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = dumps(data.draw(mutated(json.loads(lines[i]))))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            traces, report = read_trace(path)
        except FileFormatError:
            traces, report = None, None
        loaded = read_files([path], ["upload.jsonl"])  # the dashboard's reader never raises
    assert all(isinstance(e, str) and "upload.jsonl" in e for e in loaded.errors)
    if traces is None:
        assert loaded.errors and not loaded.traces
        return
    if not _line_is_valid(lines[i]):
        assert report.skipped_lines >= 1  # said, never used
    for t in traces:  # what is returned re-reads as valid records
        assert _line_is_valid(dumps(t.header.to_dict())) and all(_line_is_valid(dumps({"kind": "step", **s.to_dict()}))
                                                                 for s in t.steps)


@FUZZ
@given(data=st.data())
def test_a_truncated_trace_keeps_every_complete_record(data) -> None:
    text = "\n".join(_trace_lines()) + "\n"
    cut = data.draw(truncated(text.encode()))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.jsonl"
        path.write_bytes(cut)
        try:
            traces, _ = read_trace(path)
        except FileFormatError:
            return
    whole = cut.count(b"\n")  # complete lines: every step of them comes back, in its trace
    assert sum(len(t.steps) + 1 for t in traces) >= whole - 1


# ---- bench's store (its mode traces) -------------------------------------------------------------
def _expected() -> Expected:
    t = _traces()[0]
    return Expected("dynamic", lambda prompt_tokens: t.header.config, t.header.model, "h", {})


@FUZZ
@given(data=st.data())
def test_bench_store_never_reuses_a_malformed_generation(data, capsys) -> None:
    lines = _trace_lines()
    headers = [i for i, line in enumerate(lines) if '"kind": "header"' in line]
    i = data.draw(st.sampled_from(headers))
    header = json.loads(lines[i])
    header["meta"] = data.draw(mutated(header["meta"]))
    lines[i] = dumps(header)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dynamic.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            done = load_store(path, _expected())
        except ValueError as err:  # well-formed, made with another head (head_sha dropped): refused, named
            assert not isinstance(err, FileFormatError) and str(path) in str(err) and "was made with" in str(err)
            return
    for r in done.values():  # reused results are well-formed
        assert r.mode == "dynamic" and type(r.turn) is int and r.turn >= 1
        assert math.isfinite(r.seconds) and r.seconds >= 0 and isinstance(r.category, str)
    assert len(done) >= 1  # the other generation is kept


# ---- Spec-Bench answers ---------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_spec_bench_answers_are_read_or_refused(data) -> None:
    records = answer_records(list(_traces()), "tiny-dynamic", tstamp=0.0)
    assert len(records) == 1
    bad = data.draw(mutated(records[0]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.jsonl"
        path.write_text(dumps(records[0]) + "\n" + dumps(bad) + "\n", encoding="utf-8")
        try:
            answers = read_answers(path)
        except FileFormatError as err:
            assert str(path) in str(err) and "line 2" in str(err)
            return
    speed = mean_speed(answers)  # what the answers feed
    assert math.isnan(speed) or speed >= 0


# ---- bench's summary ------------------------------------------------------------------------------
SUMMARY = {"modes": {"vanilla": {"tau": 1.0, "speedup": 1.0, "tokens_per_second": 20.0, "tokens": 40},
                     "dynamic:auto": {"tau": 2.1, "speedup": 1.4, "tokens_per_second": 28.0, "tokens": 40}},
           "configs": {"vanilla": {}, "dynamic:auto": {}}, "generations": 2, "questions": 1}


@FUZZ
@given(data=st.data())
def test_bench_summary_is_read_or_refused(data) -> None:
    bad = data.draw(mutated(SUMMARY))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "20261201-000000" / "summary.json"
        path.parent.mkdir()
        path.write_text(dumps(bad), encoding="utf-8")
        try:
            summary = read_summary(path)
        except FileFormatError as err:
            assert str(path) in str(err)
            summary = None
        measured = measured_auto_speedup(Path(tmp))  # the dashboard's reader never raises
    if summary is None:
        assert measured is None
    elif measured is not None:
        assert math.isfinite(measured.speedup) and measured.speedup >= 0


# ---- cost caches -----------------------------------------------------------------------------------
COSTS = json.loads(json.dumps(budget_costs.Costs("tiny|fuzz", {1: 0.01, 2: 0.012}, {"1/0": (0.001, 0.0005)}, 0.002,
                                           {"repeats": 3}, {768: {1: 0.02}}, {32: 0.05}, 0.0001, 0.0002).to_json()))


@FUZZ
@given(data=st.data())
def test_a_malformed_cost_cache_is_measured_again(data) -> None:
    budget_costs.save_costs(budget_costs.Costs.from_json(COSTS))
    assert budget_costs.load_costs(COSTS["key"]) is not None
    bad = data.draw(mutated(COSTS))
    budget_costs.cost_path(COSTS["key"]).write_text(dumps(bad), encoding="utf-8")
    costs = budget_costs.load_costs(COSTS["key"])
    if costs is not None:  # usable as the cost model uses it
        seconds = [*costs.verify.values(), *costs.prefill.values(), costs.overhead,
                   *(t for v in costs.draft.values() for t in v),
                   *(t for v in costs.verify_by_context.values() for t in v.values())]
        assert all(math.isfinite(s) and s >= 0 for s in seconds) and all(n > 0 for n in costs.verify)
        # the host terms are signed (a real round may cost less than the probes): finite, and the
        # modelled round keeps its floor
        assert math.isfinite(costs.host_tree) and math.isfinite(costs.host_plain)
        assert costs.t_verify(1) >= 0 and costs.t_plain() >= 0
        assert all(costs.round_cost(2, 1, *map(int, shape.split("/"))) >= 0 for shape in costs.draft)


NS, TOP_KS, VOCABS = (1, 2, 4), (1, 2), (0,)
REPORT = {"curve": [{"total_tokens": n, "speedup": 1.0} for n in NS], "vanilla_tokens_per_s": 50.0, "t_plain": 0.02,
          "t_verify": {"1": 0.01, "2": 0.012, "4": 0.015}, "alpha": 0.9,
          "chosen": {"total_tokens": 4, "depth": 2, "top_k": 2, "draft_vocab": 0},
          "expected_tokens_per_s": 60.0, "expected_speedup": 1.2, "expected_accept_length": 1.5, "costs": COSTS,
          "lookup_tokens": 10, "expected_lookup_nodes": 1.5,
          "accept_table": {"ns": list(NS), "depths": [1, 2], "top_ks": list(TOP_KS), "vocabs": [0],
                           "grid": {"1/0": [[1.0, 1.2, 1.3], [1.0, 1.3, 1.5]]}, "lookup_tokens": 10,
                           "lookup_grid": {"1/0": [[0.0, 1.0, 2.0], [0.5, 1.5, 2.5]]}},
          "top": [], "by_context": [], "best_per_vocab": [], "host_ms": {"tree": 1.0, "plain": 0.5},
          "calibration_rounds": 12, "calibration_accept_length": 1.4, "costs_file": "costs.json"}


@FUZZ
@given(data=st.data())
def test_a_malformed_auto_report_is_chosen_again(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "auto.json"
        path.write_text(dumps(REPORT), encoding="utf-8")
        assert budget_report.read_auto_report(path, NS, TOP_KS, VOCABS) == REPORT
        path.write_text(dumps(data.draw(mutated(REPORT))), encoding="utf-8")
        report = budget_report.read_auto_report(path, NS, TOP_KS, VOCABS)
    if report is not None:
        chosen = report["chosen"]
        assert chosen["total_tokens"] in NS and chosen["top_k"] in TOP_KS and chosen["draft_vocab"] in VOCABS
        assert report["t_verify"]["1"] > 0 and report["t_plain"] > 0
        assert measured_under_load(report["t_verify"]["1"], 0.01) in (True, False)
        typed = budget_report.AutoReport.from_cached(report, {"dtype": "float32", "tokens_per_s": 50.0}, path)
        assert typed.chosen == chosen and typed.expected_speedup_same_dtype == report["expected_speedup"]


# ---- head config.json and weights -------------------------------------------------------------------
SHAPE_FIELDS = (  # those config.json's tensor shapes follow from"hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size",
                "head_dim", "draft_vocab_size", "target_hidden_size")


@functools.cache
def _head_files(kind: str) -> dict[str, bytes]:
    target, _ = _pair()
    head = new_head(target, seed=1, kind=kind, draft_ids=torch.arange(8) if kind == "eagle3" else None)
    head.token_counts.copy_(torch.arange(VOCAB))
    with tempfile.TemporaryDirectory() as tmp:
        save_head(head, tmp)
        return {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}


def _tensor_mutation(state: dict[str, torch.Tensor], data) -> dict[str, torch.Tensor]:
    """One tensor dropped, retyped, reshaped or (integer ones) pushed out of range."""
    state = dict(state)
    name = data.draw(st.sampled_from(sorted(state)))
    t = state[name]
    op = data.draw(st.sampled_from(("drop", "retype", "shorter", "flat", "range")))
    if op == "drop":
        del state[name]
    elif op == "retype":
        state[name] = t.to(torch.int32) if t.is_floating_point() else t.to(torch.float32)
    elif op == "shorter" and t.dim() and t.shape[0] > 1:
        state[name] = t[:-1].contiguous()
    elif op == "flat":
        state[name] = t.reshape(-1).contiguous() if t.dim() > 1 else t.reshape(1, -1).contiguous()
    elif t.is_floating_point():
        state[name] = torch.full_like(t, math.nan)
    elif t.numel() and t.dtype != torch.bool:  # an id, offset or count below zero
        state[name] = t.clone().reshape(-1).index_fill_(0, torch.tensor([0]), -5).reshape(t.shape)
    return state


@FUZZ
@given(data=st.data(), kind=st.sampled_from(HEAD_KINDS))
def test_head_is_loaded_or_refused(data, kind) -> None:
    target, _ = _pair()
    files = dict(_head_files(kind))
    with tempfile.TemporaryDirectory() as tmp:
        what = data.draw(st.sampled_from(("config", "weights", "counts", "truncate")))
        if what == "config":  # any field, or one the shapes come from set to another size
            config = json.loads(files["config.json"])
            if data.draw(st.booleans()):
                config = data.draw(mutated(config))
            else:
                field = data.draw(st.sampled_from([f for f in SHAPE_FIELDS if f in config]))
                config[field] = data.draw(st.sampled_from((None, -1, 0, 1, 3, 7, 10**6, "x", [config[field]])))
            files["config.json"] = dumps(config).encode()
        elif what in ("weights", "counts"):
            name = "model.safetensors" if what == "weights" else COUNTS_FILE
            Path(tmp, "x").write_bytes(files[name])
            state = _tensor_mutation(load_file(str(Path(tmp, "x"))), data)
            save_file(state, str(Path(tmp, "x")))
            files[name] = Path(tmp, "x").read_bytes()
        else:
            name = data.draw(st.sampled_from(sorted(files)))
            files[name] = data.draw(truncated(files[name]))
        head_dir = Path(tmp, "head")
        head_dir.mkdir()
        for name, blob in files.items():
            (head_dir / name).write_bytes(blob)
        try:
            head = load_head(head_dir, target)
        except FileFormatError as err:
            assert str(head_dir) in str(err)
            return
    assert head.config.vocab_size == VOCAB and int(head.token_counts.min()) >= 0
    width = HIDDEN * (3 if kind == "eagle3" else 1)  # the head drafts: finite features out
    out = head(torch.tensor([[1, 2]]), torch.randn(1, 2, width), torch.tensor([[3, 4]]))
    assert out.shape == (1, 2, HIDDEN) and bool(out.isfinite().all())
    if kind == "eagle3":
        ids = head.d2t + torch.arange(head.d2t.numel())
        assert int(ids.min()) >= 0 and int(ids.max()) < VOCAB


# ---- features: manifest.json and shards ---------------------------------------------------------------
@functools.cache
def _shard() -> dict[str, torch.Tensor]:
    target, _ = _pair()
    samples = [(torch.tensor([1, 2, 3, 4]), torch.tensor([False, True, True, False])),
               (torch.tensor([5, 6, 7]), torch.tensor([False, False, True]))]
    with tempfile.TemporaryDirectory() as tmp:
        _write_shard(target, samples, Path(tmp, "s.safetensors"), None)
        return load_file(str(Path(tmp, "s.safetensors")))


def _shard_mutation(data) -> dict[str, torch.Tensor]:
    shard = dict(_shard())
    op = data.draw(st.sampled_from(("tensor", "offsets", "ids", "width")))
    if op == "tensor":
        return _tensor_mutation(shard, data)
    if op == "offsets":
        values = data.draw(st.lists(st.integers(-2, 10), min_size=0, max_size=4))
        shard["offsets"] = torch.tensor(values, dtype=torch.long)
    elif op == "ids":
        ids = shard["input_ids"].clone()
        ids[data.draw(st.integers(0, len(ids) - 1))] = data.draw(st.sampled_from((-1, VOCAB, VOCAB + 100)))
        shard["input_ids"] = ids
    else:
        shard["features"] = torch.cat([shard["features"], shard["features"][:, :1]], 1)
    return shard


@FUZZ
@given(data=st.data())
def test_feature_shards_are_read_or_refused(data) -> None:
    target, _ = _pair()
    with tempfile.TemporaryDirectory() as tmp:
        save_file(_shard(), str(Path(tmp, "train-00000.safetensors")))
        save_file(_shard_mutation(data), str(Path(tmp, "train-00001.safetensors")))
        try:
            seqs = load_shards(tmp, "train", target_config=target.config)
        except FileFormatError as err:
            assert "train-00001.safetensors" in str(err)
            return
    for s in seqs:  # only well-formed samples come back
        n = len(s.input_ids)
        assert s.features.shape == (n, HIDDEN) and s.loss_mask.shape == (n,) and s.loss_mask.dtype == torch.bool
        assert n == 0 or (int(s.input_ids.min()) >= 0 and int(s.input_ids.max()) < VOCAB)


MANIFEST_OK = {"model": "tiny-llama", "target_sha256": "ab", "dtype": "float32", "n_conversations": 4, "max_len": 64,
               "heldout_fraction": 0.5, "seed": 0, "shard_size": 2, "self_distill": None, "head_type": "eagle1",
               "feature_layers": None, "samples_sha256": "cd", "stats": {"train_samples": 2}}


@FUZZ
@given(data=st.data())
def test_features_manifest_is_read_or_refused(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        save_file(_shard(), str(Path(tmp, "train-00000.safetensors")))
        Path(tmp, MANIFEST).write_text(dumps(data.draw(mutated(MANIFEST_OK))), encoding="utf-8")
        try:
            manifest = check_features(Path(tmp))
        except FileFormatError as err:
            assert MANIFEST in str(err)
            return
        except ValueError as err:  # a well-formed manifest of an unfinished prepare: refused as such
            assert "incomplete" in str(err)
            return
    assert manifest.get("head_type", "eagle1") in HEAD_KINDS and isinstance(manifest["stats"], dict)


# ---- the distill store: manifest, chunks and open.jsonl ------------------------------------------------
SETTINGS = {"model": "tiny-llama", "target_sha256": "ab", "max_new_tokens": 8, "max_prompt_tokens": 64,
            "temperature": 0.0, "seed": 0}


def _record(i: int) -> dict:
    return {"id": i, "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": f"a{i}"}],
            "truncated": False, "new_tokens": 2}


def _store(root: Path) -> DistillStore:
    """Two sealed chunks (conversations 0-2, 3-4) and two records of the open window (5, 6)."""
    store = DistillStore.open(root, SETTINGS)
    for end, ids in ((3, range(3)), (5, range(3, 5))):
        store.append([_record(i) for i in ids])
        store.seal(end, {"skipped_long": 0, "seconds": 0.1})
    store.append([_record(5), _record(6)])
    return store


def _check_conversations(convs: list) -> None:
    for conv in convs:
        assert conv and all(t["role"] in ("system", "user", "assistant") and isinstance(t["content"], str)
                            for t in conv)


@FUZZ
@given(data=st.data())
def test_distill_manifest_and_chunks_are_read_or_refused(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = _store(root)
        if data.draw(st.booleans()):  # the manifest
            (root / STORE_MANIFEST).write_text(dumps(data.draw(mutated(store.manifest))), encoding="utf-8")
        else:  # a record inside a chunk, the chunk's hash updated (only the schema can tell)
            chunk = store.manifest["chunks"][0]
            lines = gzip.decompress((root / chunk["file"]).read_bytes()).decode().splitlines()
            lines[1] = dumps(data.draw(mutated(json.loads(lines[1]))))
            blob = gzip.compress(("\n".join(lines) + "\n").encode())
            (root / chunk["file"]).write_bytes(blob)
            chunk["sha256"] = hashlib.sha256(blob).hexdigest()
            (root / STORE_MANIFEST).write_text(dumps(store.manifest), encoding="utf-8")
        try:
            convs, _ = read_distilled(root)
            DistillStore.open(root, SETTINGS)  # resume's check of the settings
        except FileFormatError as err:
            assert str(root) in str(err)
            return
        except ValueError as err:  # a well-formed manifest with other settings: refused, naming the field
            assert "holds replies made with" in str(err)
            return
    _check_conversations(convs)


@FUZZ
@given(data=st.data())
def test_distill_open_window_skips_and_counts_a_malformed_line(data) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _store(root)
        lines = (root / OPEN_FILE).read_text(encoding="utf-8").splitlines()
        lines[0] = dumps(data.draw(mutated(json.loads(lines[0]))))
        (root / OPEN_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
        stats = ReadStats()
        window = DistillStore.open(root).read_open(stats)
        convs, _ = read_distilled(root)
    assert window[6] == _record(6)  # the good record of the window is kept
    try:
        check_record(json.loads(lines[0]), root / OPEN_FILE, "line 1")
        assert stats.bad_lines == 0  # a mutation that left a valid record (an id moved, a text cut)
    except (FileFormatError, ValueError):
        assert stats.bad_lines == 1 and 5 not in window  # skipped and counted, never used
    _check_conversations(convs)
    assert len(convs) >= 6  # five sealed, the good open one


# ---- the cases issue 36 found, each one sentence naming the file and the field -------------------------
def test_the_reported_distill_cases_are_one_sentence(tmp_path) -> None:
    store = _store(tmp_path)
    manifest = store.manifest
    cases = {"a list": [manifest], "without settings": {k: v for k, v in manifest.items() if k != "settings"},
             "a chunk without its sha": {**manifest, "chunks": [{k: v for k, v in manifest["chunks"][0].items()
                                                                 if k != "sha256"}]}}
    for why, bad in cases.items():
        (tmp_path / STORE_MANIFEST).write_text(dumps(bad), encoding="utf-8")
        with pytest.raises(FileFormatError, match=f"{STORE_MANIFEST}") as err:
            DistillStore.open(tmp_path, SETTINGS)
        assert "\n" not in str(err.value), why
    assert "'settings' is missing" in _refusal(tmp_path, cases["without settings"])
    assert "'sha256' is missing" in _refusal(tmp_path, cases["a chunk without its sha"])
    (tmp_path / STORE_MANIFEST).write_text(dumps(manifest), encoding="utf-8")
    (tmp_path / OPEN_FILE).write_text(dumps({k: v for k, v in _record(5).items() if k != "new_tokens"}) + "\n")
    stats = ReadStats()
    assert DistillStore.open(tmp_path).read_open(stats) == {} and stats.bad_lines == 1  # never a KeyError at seal


def _refusal(root: Path, manifest: object) -> str:
    (root / STORE_MANIFEST).write_text(dumps(manifest), encoding="utf-8")
    with pytest.raises(FileFormatError) as err:
        DistillStore.open(root)
    return str(err.value)


@pytest.mark.parametrize("case, field", [("width", "features"), ("offsets", "offsets"), ("ids", "input_ids"),
                                         ("mask", "loss_mask")])
def test_the_reported_shard_cases_are_one_sentence(tmp_path, case, field) -> None:
    target, _ = _pair()
    shard = dict(_shard())
    if case == "width":
        shard["features"] = shard["features"][:, :-1].contiguous()
    elif case == "offsets":
        shard["offsets"] = torch.tensor([0, 5, 3, 7])
    elif case == "ids":
        shard["input_ids"] = shard["input_ids"].clone().index_fill_(0, torch.tensor([2]), VOCAB)
    else:
        shard["loss_mask"] = shard["loss_mask"][:-1].contiguous()
    save_file(shard, str(tmp_path / "train-00000.safetensors"))
    with pytest.raises(FileFormatError) as err:
        load_shards(tmp_path, "train", target_config=target.config)
    message = str(err.value)
    assert "train-00000.safetensors" in message and field in message and "\n" not in message
