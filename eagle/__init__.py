"""EAGLE-2 Explorer: an EAGLE-2 speculative decoder that records every draft tree it builds.

`from eagle import explore` is the notebook API (eagle.notebook). It is loaded on first access so that
`import eagle.trace` and friends stay light (no pandas, no decoder)."""


def __getattr__(name: str):
    if name in ("explore", "Explorer", "Exploration"):
        from . import notebook
        return getattr(notebook, name)
    raise AttributeError(f"module 'eagle' has no attribute {name!r}")
