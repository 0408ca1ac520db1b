"""Runtime data shipped inside the package: the trained draft heads (heads/<target name>/), the MT-bench
questions and EAGLE-1's default static tree. Read through importlib.resources so an installed wheel
finds them as well as a checkout does."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def resource_path(*parts: str) -> Path:
    """A shipped file or folder as a filesystem path (the wheel is installed unzipped: zip_safe=False)."""
    return Path(str(files(__name__).joinpath(*parts)))
