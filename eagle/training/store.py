"""The self-distilled replies as a store that lives in the repository and resumes on any machine.

    data/distill/<model>/
      manifest.json          settings, the target's weights hash, the held-out rule, one entry per chunk
      chunk-00000.jsonl.gz   the replies to ShareGPT conversations [first_index, end_index), by id
      open.jsonl             replies of the window being generated (local, not committed)

Conversations are taken in windows of consecutive indices, so the data at any point is a prefix of
ShareGPT (not, say, its shortest prompts). Finished batches are appended to open.jsonl; a finished
window is sealed into the next gzip chunk (written atomically, then listed in the manifest). A run
on a fresh clone starts at the first conversation no chunk covers; a run on the same machine also
keeps the batches in open.jsonl. Bad lines are skipped and counted, a torn last line is cut, and a
store made with other settings is refused, naming the field.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from ..records.files import atomic_write, atomic_write_json, locked_append, read_json_object
from ..records.schema import FileFormatError, check_in, check_object, fail

FORMAT = "eagle2-explorer self-distill v1"
MANIFEST = "manifest.json"
OPEN_FILE = "open.jsonl"
HELDOUT_RULE = ("eagle.training.data.is_heldout: a conversation is held out when the first 8 bytes of "
                "sha256(f'{seed}\\0{first user message}') / 2**64 < heldout_fraction; prepare applies it")
# Fields a chunk's text depends on: a store refuses a run that would change any of them. The dtype is
# not one: fp32 and bf16 give the target's own greedy reply up to near-ties, and the faster one differs
# by machine (bf16 is 3x slower than fp32 on a CPU without native bf16), so each chunk records its own.
SETTING_FIELDS = ("model", "target_sha256", "max_new_tokens", "max_prompt_tokens", "temperature", "seed")
# The kinds (eagle.records.schema) of the manifest, its settings, each chunk entry and each reply record.
SETTING_KINDS = {"model": "str", "target_sha256": "str", "max_new_tokens": "nat", "max_prompt_tokens": "nat",
                 "temperature": "num", "seed": "nat"}
CHUNK_KINDS = {"file": "str", "first_index": "nat", "end_index": "nat", "records": "nat", "new_tokens": "nat",
               "truncated": "nat", "sha256": "str"}
RECORD_KINDS = {"id": "nat", "conversations": "list", "truncated": "bool", "new_tokens": "nat"}
ROLES = ("system", "human", "gpt")  # ShareGPT's names of the turns a record holds


def target_sha256(model: torch.nn.Module) -> str:
    """A hash of the target's weights rounded to bf16: the same for an fp32 and a bf16 load of one
    checkpoint (both round to the same bf16 values), different for any other weights."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return h.hexdigest()


@dataclass
class ReadStats:
    bad_lines: int = 0  # unparseable lines skipped (never truncated away)
    torn_tail: bool = False  # the open file ended in a partial line, which was cut


@dataclass
class DistillStore:
    root: Path
    manifest: dict = field(default_factory=dict)

    @property
    def next_index(self) -> int:
        """The first conversation index no sealed chunk covers."""
        chunks = self.manifest.get("chunks", [])
        return chunks[-1]["end_index"] if chunks else 0

    @classmethod
    def open(cls, root: str | Path, settings: dict | None = None) -> "DistillStore":
        """The store at root; with settings, create it or check they equal the stored ones."""
        root = Path(root)
        path = root / MANIFEST
        manifest = {}
        if path.is_file():
            manifest = check_manifest(read_json_object(path, fix=": restore it from git or remove the store"), path)
        elif settings is None:
            raise FileNotFoundError(f"No self-distilled data at {root} (expected {MANIFEST}).")
        store = cls(root, manifest)
        if settings is not None:
            store._check_or_init(settings)
        return store

    def _check_or_init(self, settings: dict) -> None:
        if not self.manifest:
            self.manifest = {"format": FORMAT, "settings": {k: settings[k] for k in SETTING_FIELDS},
                             "heldout_rule": HELDOUT_RULE, "source": settings.get("source"), "chunks": []}
            atomic_write_json(self.root / MANIFEST, self.manifest)
            return
        old = self.manifest["settings"]
        for k in SETTING_FIELDS:
            if old.get(k) != settings[k]:
                raise ValueError(f"{self.root} holds replies made with {k}={old.get(k)!r}, this run asks for "
                                 f"{settings[k]!r}: use the same setting or another output directory.")

    # ---- reading --------------------------------------------------------------------------------
    def chunk_records(self) -> Iterator[dict]:
        """Every record of the sealed chunks. A chunk is committed data whose hash the manifest holds, so a
        bad one is refused (restore it from git), never skipped."""
        for chunk in self.manifest.get("chunks", []):
            path = self.root / chunk["file"]
            if not path.is_file():
                raise FileFormatError(f"{self.root / MANIFEST} lists the chunk {chunk['file']}, which is missing: "
                                      "restore it from git.")
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != chunk["sha256"]:
                raise FileFormatError(f"{path} does not match its manifest hash: restore it from git.")
            try:
                text = gzip.decompress(data).decode("utf-8")
            except (OSError, EOFError, UnicodeDecodeError) as err:
                raise FileFormatError(f"{path} is not gzip-compressed UTF-8 ({err}): restore it from git.") from None
            # split on "\n" only: str.splitlines would also cut at U+2028 and friends, which
            # json.dumps(ensure_ascii=False) leaves raw inside a reply's text
            for lineno, line in enumerate(text.split("\n"), 1):
                if line:
                    yield check_record(_json_line(line, path, lineno), path, f"line {lineno}",
                                       range(chunk["first_index"], chunk["end_index"]))

    def read_open(self, stats: ReadStats | None = None) -> dict[int, dict]:
        """Records of the unsealed window (ids past next_index). A torn last line is cut so appends
        continue on a clean line; a bad line elsewhere is skipped and counted."""
        stats = stats if stats is not None else ReadStats()
        path = self.root / OPEN_FILE
        if not path.exists():
            return {}
        raw = path.read_bytes()
        keep = raw.rfind(b"\n") + 1
        if keep < len(raw):
            stats.torn_tail = True
            with open(path, "r+b") as fh:
                fh.truncate(keep)
        out = {}
        for lineno, line in enumerate(raw[:keep].split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                rec = check_record(_json_line(line, path, lineno), path, f"line {lineno}")
            except FileFormatError:
                stats.bad_lines += 1  # skipped, never truncated away: the rest of the window is kept
                continue
            if rec["id"] >= self.next_index:  # older ones were sealed before the file was cleared
                out[rec["id"]] = rec
        return out

    def records(self) -> list[dict]:
        """Every stored reply, sealed and open, in conversation-index order."""
        by_id = {int(r["id"]): r for r in self.chunk_records()}
        by_id.update(self.read_open())
        return [by_id[i] for i in sorted(by_id)]

    # ---- writing --------------------------------------------------------------------------------
    def append(self, records: list[dict]) -> None:
        """Append finished records to the open window (one locked write, fsynced; a full disk names the file)."""
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        locked_append(self.root / OPEN_FILE, text.encode("utf-8"))

    def seal(self, end_index: int, info: dict) -> dict:
        """Move the open window's records into the next chunk, covering [next_index, end_index)."""
        records = [r for i, r in sorted(self.read_open().items()) if i < end_index]
        number = len(self.manifest["chunks"])
        name = f"chunk-{number:05d}.jsonl.gz"
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:  # mtime 0: same text, same bytes
            gz.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))
        data = buf.getvalue()
        atomic_write(self.root / name, data)
        chunk = {"file": name, "first_index": self.next_index, "end_index": end_index, "records": len(records),
                 "new_tokens": sum(int(r["new_tokens"]) for r in records),
                 "truncated": sum(bool(r["truncated"]) for r in records), "sha256": hashlib.sha256(data).hexdigest(),
                 **info}
        self.manifest["chunks"].append(chunk)
        self.manifest["totals"] = _totals(self.manifest["chunks"])
        atomic_write_json(self.root / MANIFEST, self.manifest)
        (self.root / OPEN_FILE).unlink(missing_ok=True)  # its records are now in the chunk
        return chunk


def _json_line(line: str | bytes, path: Path, lineno: int) -> object:
    try:
        return json.loads(line)
    except ValueError as err:  # also UnicodeDecodeError
        fail(path, f"line {lineno}", f"is not valid JSON ({err})")


def check_manifest(manifest: dict, path: Path) -> dict:
    """The manifest's format, settings and chunk entries: each chunk a plain file name with its hash,
    the chunks covering consecutive conversation windows from 0."""
    if manifest.get("format") != FORMAT:
        fail(path, "field 'format'", f"is {manifest.get('format')!r:.40}: this is not a self-distillation manifest "
                                     f"({FORMAT})")
    check_object(manifest.get("settings"), path, "field 'settings'", SETTING_KINDS)
    chunks = manifest.get("chunks", [])
    if not isinstance(chunks, list):
        fail(path, "field 'chunks'", "is not a list")
    end = 0
    for i, chunk in enumerate(chunks):
        what = f"chunks[{i}]"
        check_object(chunk, path, what, CHUNK_KINDS)
        if Path(chunk["file"]).name != chunk["file"] or chunk["file"] in ("", ".", ".."):
            fail(path, f"{what} field 'file'", f"is {chunk['file']!r}, not a file name in the store")
        if chunk["first_index"] != end or chunk["end_index"] < end:
            fail(path, what, f"covers conversations [{chunk['first_index']}, {chunk['end_index']}), "
                             f"not a window starting at {end}")
        end = chunk["end_index"]
    return manifest


def check_record(rec: object, path: Path, what: str, ids: range | None = None) -> dict:
    """One reply record: its id (within the chunk's window), its ShareGPT turns, truncated, new_tokens."""
    check_object(rec, path, what, RECORD_KINDS)
    if ids is not None and rec["id"] not in ids:
        fail(path, f"{what} field 'id'", f"is {rec['id']}, outside the chunk's conversations "
                                          f"[{ids.start}, {ids.stop})")
    if not rec["conversations"]:
        fail(path, f"{what} field 'conversations'", "is empty")
    for j, turn in enumerate(rec["conversations"]):
        where = f"{what} conversations[{j}]"
        check_object(turn, path, where, {"from": "str", "value": "str"})
        check_in(turn["from"], ROLES, path, f"{where} field 'from'")
    return rec


def _totals(chunks: list[dict]) -> dict:
    keys = ("records", "new_tokens", "truncated", "skipped_long", "seconds")
    totals = {k: sum(c.get(k, 0) for c in chunks) for k in keys}
    totals["conversations_covered"] = chunks[-1]["end_index"] if chunks else 0
    return totals
