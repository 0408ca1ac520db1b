"""Tools built on the decoding core: the benchmark (bench, its Spec-Bench export), the machine-tuned
tree budget (budget) and the draft-vocabulary export (tokenmap). They use the core's public surface;
the core never imports them."""
