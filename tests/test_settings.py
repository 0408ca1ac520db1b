"""Decoding settings against what the model can do: DecodeConfig.validate(limits) and the dashboard's
input bounds (app.settings.bounds), without a model or a browser."""
from __future__ import annotations

import pytest

from app.settings import BROWSER_INT_MAX, bounds
from eagle.core.config import RANGES, SEED_MAX, DecodeConfig, ModelLimits

LIMITS = ModelLimits(max_context=8192, vocab_size=49152)


@pytest.mark.parametrize("change,sentence", [
    (dict(max_new_tokens=100_000), "max_new_tokens 100000 is more than the model's context of 8192 tokens "
                                   "can hold (at most 8191)"),
    (dict(draft_vocab=10_000_000), "draft_vocab 10000000 is larger than the model's vocabulary of 49152 "
                                   "tokens (0 uses all of it)"),
    (dict(seed=-1), f"seed must be in 0..{SEED_MAX}, got -1"),
    (dict(seed=2**70), f"seed must be in 0..{SEED_MAX}, got {2**70}"),
])
def test_validate_refuses_what_the_model_cannot_do_in_one_sentence(change, sentence) -> None:
    with pytest.raises(ValueError) as err:
        DecodeConfig(**change).validate(LIMITS)
    assert str(err.value) == sentence


def test_the_model_limits_are_optional_and_inclusive() -> None:
    DecodeConfig(max_new_tokens=100_000, draft_vocab=10_000_000).validate()  # no model: the decoder's ranges only
    DecodeConfig(max_new_tokens=8191, draft_vocab=49152, seed=SEED_MAX).validate(LIMITS)


def test_input_bounds_follow_the_model_and_the_browser() -> None:
    assert bounds("max_new_tokens", LIMITS) == (1, 8191)
    assert bounds("max_new_tokens", ModelLimits(10**6, 10)) == RANGES["max_new_tokens"]
    assert bounds("draft_vocab", LIMITS) == (0, 49152)
    assert bounds("seed", LIMITS) == (0, BROWSER_INT_MAX)  # below torch's 2**63 - 1
    assert bounds("total_tokens", None) == RANGES["total_tokens"]
