"""Where a target model is: the embedded default's name, a local directory (checked before loading) or
a Hugging Face id (offline at once when the hub is off or out of reach), and the cache everything
measured or converted goes under."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from ..records.files import CommandError

DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelLoadError(CommandError):
    """A model could not be loaded; the message says what to install or fix."""


def cache_dir() -> Path:
    return Path(os.environ.get("EAGLE_CACHE", Path.home() / ".cache" / "eagle2-explorer"))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def looks_like_path(name: str) -> bool:
    """A Hugging Face id is NAME or ORG/NAME; anything else the user typed is meant as a directory."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def hub_offline(repo_id: str, not_an_id: str, not_cached: str) -> bool:
    """Whether the hub must be treated as offline for `repo_id` (HF_HUB_OFFLINE set, or the hub not
    reachable in one try); ModelLoadError `not_an_id`, or `not_cached` (its {why} filled in) when an
    offline lookup could not succeed, so a user waits for no retries."""
    from huggingface_hub import try_to_load_from_cache
    try:
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # huggingface_hub's HFValidationError: not an id at all
        raise ModelLoadError(not_an_id) from None
    told = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    offline = told or not _hub_reachable()
    if offline and not cached:
        why = "HF_HUB_OFFLINE is set" if told else f"{_hub_host()} cannot be reached"
        raise ModelLoadError(not_cached.format(why=why))
    return offline


def _hub_host() -> str:
    return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((_hub_host(), 443), timeout=timeout):
            return True
    except OSError:
        return False


def _check_local_model(path: Path, name: str) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"No model directory at {name}: give an existing directory or a Hugging Face id "
                             "(ORG/NAME).")
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: it is not a Hugging Face model directory.")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}): copy the "
                             "model's tokenizer files next to its weights.")


def locate_model(name_or_path: str) -> tuple[str, bool]:
    """Where to load a model from and whether to stay offline. A local directory is checked here
    (transformers would call a missing one an invalid repo id); a hub id that is not cached fails at
    once when the hub is off (HF_HUB_OFFLINE) or cannot be reached, instead of after a minute of
    retries."""
    path = Path(name_or_path).expanduser()
    if path.exists() or looks_like_path(name_or_path):
        _check_local_model(path, name_or_path)
        return str(path), True
    offline = hub_offline(name_or_path, f"{name_or_path!r} is neither a model directory nor a Hugging Face id "
                          "(ORG/NAME).", f"Model {name_or_path!r} is not in the local Hugging Face cache and {{why}}: "
                          "download it once online, or give a local model directory.")
    return name_or_path, offline

