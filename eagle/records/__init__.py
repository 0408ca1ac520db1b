"""Records and traces, the bottom layer: what the decoder writes and every reader opens. The trace
schema (trace), the one check of a file a reader opens (schema), atomic writes and locks (files), the
arithmetic of tau and rates (stats), the phase timer (timing), the Markdown table writer (markdown)
and the shipped prompt sets (questions). It imports nothing else of eagle but its resources."""
