"""Token ids -> text without ever splitting a character.

A byte-level tokenizer (SmolLM2, Llama 3, Qwen) may spread one character over several tokens: an
emoji is often three or four tokens of one to three bytes each, so decoding a round's tokens on their
own prints U+FFFD for each half. Two helpers:

    next_text(tokenizer, window, new_tokens, final)   the reply's next piece of text, for the stream:
        the technique of HF's TextStreamer and vLLM's incremental detokenizer. The tokens since the
        last emitted piece began are decoded with and without the new ones and the difference is
        emitted; while it ends in U+FFFD (a character still incomplete) it is held back, and `final`
        flushes it. Special tokens are skipped, so the pieces of a whole generation concatenate to
        tokenizer.decode(tokens, skip_special_tokens=True), for any tokenizer whose decode of a
        prefix ending on a whole character is a prefix of the decode of the whole.
    token_text(tokenizer, token)                       one token's label (tree nodes, bonus tokens):
        its decode, or, when that is a partial UTF-8 character, its bytes written \\xNN.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["TextWindow", "next_text", "token_text"]

REPLACEMENT = "\ufffd"  # what a decode writes for bytes that are not (yet) a whole character
_BYTE_TOKENS = re.compile(r"(<0x[0-9A-Fa-f]{2}>)+")  # SentencePiece byte fallback: already readable


@dataclass(frozen=True)
class TextWindow:
    """What the stream carries from round to round: the tokens from the start of the last emitted
    piece on (decoded again as context, so a decoder that looks at its neighbours, e.g. a
    SentencePiece leading space, decodes them as in the whole reply), and how many of them were
    emitted already."""
    tokens: tuple[int, ...] = ()
    read: int = 0


def next_text(tokenizer, window: TextWindow, new_tokens: list[int], final: bool = False) -> tuple[str, TextWindow]:
    """The text that new_tokens add to the reply, and the window for the next call. Returns "" while
    the new text is empty or ends in a character still incomplete; `final` (the last round) emits
    whatever is left, U+FFFD included, so nothing the full decode shows is lost."""
    tokens = window.tokens + tuple(new_tokens)
    before = tokenizer.decode(list(tokens[: window.read]), skip_special_tokens=True) if window.read else ""
    after = tokenizer.decode(list(tokens), skip_special_tokens=True)
    if not final and (len(after) <= len(before) or after.endswith(REPLACEMENT)):
        return "", TextWindow(tokens, window.read)
    return after[len(before):], TextWindow(tokens[window.read:], len(tokens) - window.read)


def token_text(tokenizer, token: int) -> str:
    """One token's text as a label: special tokens as written (<|im_end|>); a token that holds part
    of a character as its bytes, valid characters kept and the rest written \\xNN (' \\xf0\\x9f\\x98':
    a space and the first three bytes of an emoji); a SentencePiece byte token keeps its name, '<0xF0>'."""
    text = tokenizer.decode([token])
    if REPLACEMENT not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(token)
    if _BYTE_TOKENS.fullmatch(piece):
        return piece
    byte_of = _byte_level_map()
    if not all(c in byte_of for c in piece):  # not a byte-level token: the decode is all we know
        return text
    return bytes(byte_of[c] for c in piece).decode("utf-8", errors="backslashreplace")


@lru_cache(maxsize=1)
def _byte_level_map() -> dict[str, int]:
    """GPT-2 byte-level BPE's alphabet: the printable stand-in character -> the byte it spells."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # deferred: only partial characters need it
    return {char: byte for byte, char in bytes_to_unicode().items()}
