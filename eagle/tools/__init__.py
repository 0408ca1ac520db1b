"""Tools built on the decoding core: the settings every front end parses (loading, checks), the one
Session they decode through, the benchmark (bench/), the machine-tuned tree budget (budget/), the
profile, and the head and draft-vocabulary exports. They use the core's public surface; the core
never imports them."""
