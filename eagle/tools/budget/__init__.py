"""The hardware-tuned tree budget: measure what a round costs on this machine, estimate what each budget
would accept from recorded draft trees, and pick the budget with the most expected tokens per second.

    expected tokens/s (n, depth, top_k, vocab) = E[accept length] / (t_verify(n) + t_draft(depth, top_k, vocab)
                                                                       + per-round overhead + host)

Costs are measured with the decoder's own functions (target forward + softmax for verification;
eagle.core.decode.draft_round, a round's draft + rerank + tree building + trace bookkeeping, for drafting)
and cached per model, torch thread count and device under $EAGLE_CACHE (default
~/.cache/eagle2-explorer/costs/). The probes run their parts in tight loops, with warm caches; a real
round interleaves them with the target's forward, which evicts the draft head's weights, and adds the
acceptance and record keeping; and a real verify, between draft forwards, averages more than the
probe's median. Both are measured once per report by decoding a few calibration prompts with the chosen
tree and with plain decoding side by side, token for token, so a drifting machine moves both alike (see
host_terms): the verify scale (real verify + acceptance over the probe's) and `host` (what the rounds
spend beyond the modelled draft and overhead). A generation's time
adds the prefill of its prompt (measured at two lengths, linear between): expected_seconds.

E[accept length] comes from a *replay*: a calibration run drafts a large tree (depth CAL_DEPTH,
top_k CAL_TOP_K, CAL_TOTAL verified nodes) and records every candidate's value and whether it was
accepted. For a smaller budget we rerun EAGLE-2's beam and rerank on the recorded candidates; the
accepted length is 1 + the accepted path nodes that survive. That is exact whenever the smaller tree's
verified nodes are a subset of the recorded ones (greedy), and a lower bound otherwise. The EAGLE-2
paper's shortcut, 1 + alpha * (sum of kept values) with alpha fitted on the same run, is the
`method="value"` alternative. With a prompt-lookup branch the replay also counts the branch's nodes per
round and the share of rounds that verify one, and a round's verify is priced per kind of round:
(1 - share) * t_verify(n) + share * t_verify(n + nodes / share).

costs (the measured cost model, its cache and the host terms) -> replay (calibration rounds replayed
for every budget) -> report (AutoReport, the typed answer, and its cached file) -> choice (the best
budget, auto_config and tuned_config for a generation)."""
