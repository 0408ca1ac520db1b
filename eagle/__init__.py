"""EAGLE-2 Explorer: an EAGLE-2 speculative decoder that records every draft tree it builds.

`from eagle import explore` is the notebook API (eagle.notebook). It is loaded on first access so that
`import eagle.records.trace` and friends stay light (no pandas, no decoder). `eagle.SettingError` is what
explore() raises for a bad setting."""


def __getattr__(name: str):
    if name in ("explore", "Explorer", "Exploration"):
        from . import notebook
        return getattr(notebook, name)
    if name == "SettingError":  # a bad flag or keyword (eagle.core.config); light, so no notebook import
        from .core.config import SettingError
        return SettingError
    raise AttributeError(f"module 'eagle' has no attribute {name!r}")
