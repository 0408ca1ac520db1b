"""File integrity in one place: atomic replacement, an exclusive lock per output, whole-record
appends, and the error boundary every command runs inside.

Every file this project writes (heads, shards, checkpoints, manifests, summaries, caches, tables,
figures, exports) goes through `atomic_write`: a unique temporary file in the same directory, fsynced,
then renamed over the destination, so a crash leaves either the old file or the new one and two
writers never share a temporary name. Writers hand it bytes (safetensors.torch.save, `torch_bytes`,
a CSV's text), which it writes with `_write_all`, the one low-level write beside `locked_append`'s: a
full disk or any other write error is one sentence naming the file, and the temporary is removed. `exclusive_lock` guards an output that a job appends to over time; `locked_append`
adds one whole record group to a shared log. `run_guarded` turns every failure a user can cause
into one sentence and exit code 2."""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator

from safetensors import SafetensorError as _SafetensorError

from .schema import FileFormatError


class CommandError(RuntimeError):
    """A failure whose message tells the user what to fix (the command boundary prints just that)."""


class BusyError(CommandError):
    """Another process holds the lock on an output."""


class WriteError(CommandError):
    """A file could not be written (a full disk, a writer's own failure): the message names it."""


def atomic_write(path: str | Path, data: bytes | str | Callable[[Path], None]) -> None:
    """Replace `path` with `data` (bytes, text, or a function that writes the temporary path)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        if callable(data):
            os.close(fd)
            data(tmp)
        else:
            try:
                _write_all(fd, data.encode("utf-8") if isinstance(data, str) else data)
            finally:
                os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _naming(err, path) from None
    except CommandError:
        tmp.unlink(missing_ok=True)
        raise
    except (RuntimeError, _SafetensorError) as err:  # a writer's own report of a failed write (torch.save's,
        tmp.unlink(missing_ok=True)                  # safetensors'), which names no file
        raise WriteError(f"could not write {path}: {error_sentence(err)}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`, then fsync: the one low-level write of atomic_write and locked_append.
    A short write is continued; a failed one (ENOSPC, EIO, EFBIG) raises OSError."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def torch_bytes(obj: object) -> bytes:
    """What torch.save writes for `obj`, as bytes for atomic_write (torch is imported only here)."""
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _naming(err: OSError, path: Path) -> OSError:
    """The error with the destination's name: a full disk reports no file at write or flush time."""
    if err.filename is not None:
        return err
    return type(err)(err.errno, err.strerror or str(err), str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_json(path: str | Path, obj, indent: int | None = 2) -> None:
    atomic_write(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def exclusive_lock(path: str | Path, what: str, wait: bool = False) -> Iterator[None]:
    """Hold an advisory lock on `path` (created if missing) for the block; a second holder gets
    BusyError at once instead of waiting or mixing its output with ours (or, with `wait`, blocks
    until the first is done: for a shared cache that the first holder fills)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BusyError(f"{what} is in use by another run (lock {path}); wait for it or use another "
                            "output.") from None
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def read_json_or_none(path: str | Path) -> dict | None:
    """A JSON object from `path`, or None when it is missing or unreadable (a cache to recompute)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def read_json_object(path: Path, label: str = "", fix: str = "") -> dict:
    """A JSON object the user's run depends on: one sentence naming the file (after `label`, ending
    with the `fix` hint) when it is not valid JSON or not an object."""
    name = f"{label} {path}" if label else str(path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FileFormatError(f"{name} is not valid JSON ({err}){fix}.") from None
    if not isinstance(obj, dict):
        raise FileFormatError(f"{name} is not a JSON object{fix}.")
    return obj


def locked_append(path: str | Path, data: bytes) -> None:
    """Append `data` with one write under an exclusive lock (waiting for another writer to finish),
    fsynced, starting on a fresh line: a line torn by a killed writer then stays one bad line that
    readers skip, instead of swallowing the first record of this append."""
    try:
        _append(Path(path), data)
    except OSError as err:
        raise _naming(err, Path(path)) from None


def _append(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # as atomic_write does: --trace runs/new/t.jsonl works
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            size = fh.seek(0, os.SEEK_END)
            if size:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    data = b"\n" + data
            _write_all(fh.fileno(), data)  # O_APPEND: the write goes to the end whatever the position
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def cut_torn_tail(path: str | Path) -> int:
    """Truncate a line-oriented file after its last newline (what a writer killed mid-line leaves);
    returns the bytes cut. Only the owner of the file's lock may call this."""
    path = Path(path)
    with open(path, "r+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        keep = size
        while keep > 0:  # scan back in blocks: trace files can be large
            start = max(0, keep - 65536)
            fh.seek(start)
            block = fh.read(keep - start)
            at = block.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            keep = start
        if keep < size:
            fh.truncate(keep)
        return size - keep


def error_sentence(err: BaseException) -> str:
    """The error as one line: an OSError names its file, other messages lose their line breaks."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return " ".join(str(err).split()) or type(err).__name__


def run_guarded(command: Callable[[], int], interrupted: str = "interrupted") -> int:
    """The error boundary of every command: bad input, a missing, unreadable or unwritable file and a
    busy output each become one sentence on stderr and exit code 2; a closed pipe (`| head`) ends
    quietly; Ctrl-C prints `interrupted` and exits 130. Anything else is a bug and keeps its traceback."""
    try:
        return command()
    except BrokenPipeError:
        _silence_stdout()
        return 141  # 128 + SIGPIPE: what a shell tool stopped by a closed pipe reports
    except KeyboardInterrupt:
        print(f"\n{interrupted}", file=sys.stderr)
        return 130
    except (ValueError, OSError, CommandError) as err:
        _close_progress_bars()
        print(f"error: {error_sentence(err)}", file=sys.stderr)
        return 2


def _close_progress_bars() -> None:
    """End the progress bars a failed command left open, so its error starts a line of its own instead
    of following a bar's carriage return (tqdm is looked up, not imported: a command without bars)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not hit the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a real file: nothing left to flush
        pass


class _LogFile(logging.FileHandler):
    """The run's log file. A line it cannot write (a full disk) is dropped without logging's own
    traceback on stderr: the run's next atomic write fails on the same disk with one sentence."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def run_logger(name: str, log_path: Path) -> logging.Logger:
    """A logger writing to log_path (appending, so a resumed run keeps its history) and stderr."""
    log = logging.getLogger(f"eagle.{name}.{log_path}")
    if not log.handlers:
        log.setLevel(logging.INFO)
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
        for handler in (_LogFile(log_path), logging.StreamHandler()):
            handler.setFormatter(fmt)
            log.addHandler(handler)
        log.propagate = False
    return log
