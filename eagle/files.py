"""File integrity in one place: atomic replacement and an exclusive lock per output.

Every file this project writes that a reader may trust (heads, manifests, summaries, caches) goes
through `atomic_write`: a unique temporary file in the same directory, fsynced, then renamed over
the destination, so a crash leaves either the old file or the new one and two writers never share
a temporary name. `exclusive_lock` guards an output that a job appends to over time."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator


class BusyError(RuntimeError):
    """Another process holds the lock on an output."""


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
            with os.fdopen(fd, "wb") as fh:
                fh.write(data.encode("utf-8") if isinstance(data, str) else data)
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_json(path: str | Path, obj, indent: int | None = 2) -> None:
    atomic_write(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def exclusive_lock(path: str | Path, what: str) -> Iterator[None]:
    """Hold an advisory lock on `path` (created if missing) for the block; a second holder gets
    BusyError at once instead of waiting or mixing its output with ours."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
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
