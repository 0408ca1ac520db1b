"""A full disk in the middle of every writing command (issue 37): ENOSPC injected into the one low-level
write of eagle.records.files (what atomic_write and locked_append write with), after part of the failing write
has landed, as on a real disk. Each command stops with one sentence naming the file, exit code 2, no
traceback, no temporary or empty file left, and the same command run again on a disk with room
completes to what an uninterrupted run makes."""
import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import analysis.__main__ as analysis_main
from analysis.export import _keep_images
from eagle import cli
from eagle.records import files
from eagle.records.files import WriteError
from eagle.records.trace import write_trace
from tests.test_reliability import _finished_trace, tiny_dir  # noqa: F401  (a fixture: the tiny model on disk)


@pytest.fixture
def full_disk(monkeypatch):
    """disk["writes"] = n: the first n low-level writes succeed, the next writes half its bytes and fails
    with ENOSPC, as every later one does; None: room again."""
    disk = {"writes": None}
    real = files._write_all

    def write_all(fd: int, data: bytes) -> None:
        if disk["writes"] is None:
            return real(fd, data)
        if disk["writes"] > 0:
            disk["writes"] -= 1
            return real(fd, data)
        os.write(fd, bytes(data[:len(data) // 2]))  # what fitted
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "_write_all", write_all)
    return disk


def _contents(root: Path) -> dict[str, bytes]:
    """Every file under root but locks and logs (a log keeps each attempt's lines)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "lock" not in p.name and p.suffix != ".log"}


def _refused(argv: list[str], out: Path, capsys) -> str:
    run = analysis_main.main if argv[0] == "figures" else cli.main
    assert run(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err and len(lines) == 1, err
    assert "No space left on device" in lines[0] and str(out) in lines[0], lines[0]
    left = [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in left if p.name.endswith(".tmp")], left  # no temporary left behind
    assert not [p for p in left if p.stat().st_size == 0 and "lock" not in p.name], left  # nor an empty file
    return lines[0]


def _commands(tiny: Path, tmp: Path) -> dict[str, list[str]]:
    model = ["--model", str(tiny), "--dtype", "float32", "--threads", "1"]
    return {
        "prepare": ["prepare", *model, "--features", "{out}", "--conversations", "6", "--max-len", "48",
                    "--heldout-fraction", "0.3", "--shard-size", "1"],
        "train": ["train", *model, "--features", str(tmp / "features"), "--out", "{out}", "--steps", "4",
                  "--batch", "2", "--vocab-k", "64", "--eval-samples", "2", "--eval-every", "0",
                  "--checkpoint-every", "2", "--warmup", "1"],
        "distill": ["distill", *model, "--distill-dir", "{out}", "--conversations", "4",
                    "--distill-max-new-tokens", "4", "--distill-batch", "2"],
        "export-token-map": ["export-token-map", "--k", "100", "--out", "{out}/map.pt"],
        "figures": ["figures", "--traces", str(tmp / "t.jsonl"), "--out", "{out}", "--formats", ""],
    }


# (command, low-level writes that succeed before the disk is full): each stops in the middle of its work
CASES = [("prepare", 3), ("train", 3), ("distill", 1), ("export-token-map", 0), ("figures", 2)]


@pytest.mark.slow
@pytest.mark.parametrize("command, writes", CASES)
def test_a_full_disk_is_one_sentence_and_the_rerun_completes(tiny_dir, tmp_path, capsys, full_disk, command,  # noqa: F811
                                                             writes):
    write_trace(tmp_path / "t.jsonl", [_finished_trace(4, "A"), _finished_trace(3, "B")])
    argv = _commands(tiny_dir, tmp_path)
    if command == "train":
        assert cli.main([a.replace("{out}", str(tmp_path / "features")) for a in argv["prepare"]]) == 0
    reference, out = tmp_path / "reference", tmp_path / "out"
    run = analysis_main.main if command == "figures" else cli.main
    assert run([a.replace("{out}", str(reference)) for a in argv[command]]) == 0
    capsys.readouterr()
    full_disk["writes"] = writes
    line = _refused([a.replace("{out}", str(out)) for a in argv[command]], out, capsys)
    full_disk["writes"] = None
    assert run([a.replace("{out}", str(out)) for a in argv[command]]) == 0, line
    want, got = _contents(reference), _contents(out)
    assert want.keys() == got.keys()
    for name in want:
        if name.endswith(".safetensors"):  # shards, heads: the same tensors
            a, b = load_file(str(reference / name)), load_file(str(out / name))
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        elif name.endswith((".csv", ".md", ".gz")) or name == "map.pt":
            assert got[name] == want[name], name


def test_a_writer_that_fails_on_its_own_names_the_file_and_leaves_nothing(tmp_path):
    """torch.save's and safetensors' own write failures are RuntimeError and SafetensorError, not OSError."""
    def writer(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    with pytest.raises(WriteError, match=f"could not write {tmp_path / 'x.pt'}: PytorchStreamWriter"):
        files.atomic_write(tmp_path / "x.pt", writer)
    assert list(tmp_path.iterdir()) == []


def test_figures_a_full_disk_stopped_keep_no_image(tmp_path):
    """kaleido writes the images itself: after a failed file write none of its temporaries is kept."""
    jobs = [{"path": tmp_path / f".f{i}.png.tmp", "final": tmp_path / f"f{i}.png"} for i in range(2)]
    for job in jobs:
        job["path"].write_bytes(b"\x89PNG partial")
    with pytest.raises(WriteError, match=f"could not write the figures in {tmp_path}: No space left"):
        _keep_images(jobs, [OSError(errno.ENOSPC, "No space left on device")], tmp_path)
    assert list(tmp_path.iterdir()) == []
    jobs[0]["path"].write_bytes(b"\x89PNG whole")
    _keep_images(jobs, [], tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["f0.png"]
