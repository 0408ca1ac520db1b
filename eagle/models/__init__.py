"""Models and checkpoints, on records: the target (where a model is, the default's conversion, its
precision, the Target wrapper and its lean forward), the draft heads (EAGLE-1/2 and EAGLE-3 modules,
their checkpoint I/O and public layouts) and the KV cache both write into."""
