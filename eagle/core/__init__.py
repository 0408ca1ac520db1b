"""The decoding core, on models and records: DecodeConfig, the tree and acceptance functions, the
adaptive tree size, detokenization, the draft phase and the one step generator (decode.Decoder)."""
