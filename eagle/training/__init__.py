"""Training a draft head on top of the decoder core.

data (ShareGPT reading, chat templates, loss masks, the held-out rule) -> distill and store (self-distilled
replies, committed as compressed chunks) -> features (target hidden states in shards) -> objective (losses,
training-time test, held-out accuracy) -> train (the resumable run). commands is their command line."""
