"""`python -m eagle bench`: every mode on a question set, interleaved prompt by prompt in one run.

Modes: vanilla, static, dynamic (this repo's decoder) and hf, hf_pld (Hugging Face `generate`, plain
and with prompt lookup). A decoder mode may carry its own budget, `dynamic:TOTAL/DEPTH/TOP_K[/VOCAB]`,
so a sweep of budgets runs under the same machine load as its baselines.

--out holds: traces/<mode>.jsonl (every trace; an hf trace is a header and one summary step),
steps.parquet (one row per step) and summary.json. Each finished generation is appended (one
locked write, fsynced) to its mode's trace file; a rerun with the same --out skips every (question,
turn, mode) already there, so an interrupted bench loses no finished work. A stored generation is
reused only if it was made with the same settings, model, head weights and question text (else the
run is refused, naming what differs); one lock per --out keeps a second run from doing it all twice.

spec (the modes a run names) -> run (the models, one generation, the interleaved plan) -> store (the
traces a rerun resumes from) -> report (the summary, its tables and files) -> command (the command
line); specbench exports Spec-Bench's answer files and speed-up.
"""
