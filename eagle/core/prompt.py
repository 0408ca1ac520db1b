"""The prompt: the chat template applied to one user message or a conversation, and the one length
check every front end runs before decoding (PromptError: empty, or no room left to generate)."""
from __future__ import annotations

from .config import SettingError


class PromptError(SettingError):
    """The prompt cannot be decoded (empty, or longer than the model's context)."""


def check_prompt(ids: list[int], max_context: int) -> None:
    """The one prompt check: PromptError unless the prompt has tokens and leaves room to generate."""
    if not ids:
        raise PromptError("The prompt is empty: type something to generate from.")
    if len(ids) >= max_context:
        raise PromptError(f"The prompt is {len(ids)} tokens but the model's context holds {max_context} "
                          "(and needs room to generate): shorten it.")


def encode_prompt(tokenizer, prompt: str | list[dict], max_context: int, chat: bool = True) -> list[int]:
    """Apply the chat template (to one user message or a list of messages) and check the length."""
    if isinstance(prompt, str) and not prompt.strip():
        check_prompt([], max_context)  # blank text is empty, whatever the template would add
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    else:
        ids = tokenizer.encode(messages[-1]["content"])
    check_prompt(list(ids), max_context)
    return list(ids)
