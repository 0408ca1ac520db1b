"""Incremental detokenization (eagle.core.detok) through the real SmolLM2 tokenizer: whatever rounds the
tokens come in, the stream's pieces never split a character and concatenate to the full decode."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from eagle.core.config import DecodeConfig
from eagle.core.decode import Decoder, generate
from eagle.core.detok import REPLACEMENT, TextWindow, next_text, token_text
from eagle.models.head import new_head
from eagle.models.conversion import default_gguf_path
from tests.tiny import tiny_target

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny forwards: see tests/conftest.py

TEXTS = {
    "emoji": "Hi 😀 there 🎉! 👩‍💻 codes.",
    "cjk": "日本語のテキスト、中文字符和한국어.",
    "code": "def f(x):\n    if x:\n\t\treturn x  # ok ✓\n    return None\n",
}


@pytest.fixture(scope="module")
def tokenizer():
    path = default_gguf_path()  # the shipped model's own tokenizer, read without converting the model
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _stream(tokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    """The pieces next_text emits when ids arrive in rounds cut at `cuts`; the last round is final."""
    bounds = [0, *sorted(set(cuts)), len(ids)]
    window, pieces = TextWindow(), []
    rounds = [ids[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    for i, new in enumerate(rounds):
        piece, window = next_text(tokenizer, window, new, final=i == len(rounds) - 1)
        pieces.append(piece)
    return pieces


def _check(tokenizer, ids: list[int], cuts: list[int]) -> None:
    full = tokenizer.decode(ids, skip_special_tokens=True)
    pieces = _stream(tokenizer, ids, cuts)
    assert "".join(pieces) == full
    if REPLACEMENT not in full:
        assert not any(REPLACEMENT in p for p in pieces), pieces


@pytest.mark.parametrize("name", TEXTS)
def test_every_single_cut_keeps_characters_whole(tokenizer, name):
    ids = tokenizer.encode(TEXTS[name])
    assert REPLACEMENT in "".join(tokenizer.decode([i]) for i in ids)  # the text does split characters
    for cut in range(len(ids) + 1):
        _check(tokenizer, ids, [cut])
    _check(tokenizer, ids, list(range(len(ids))))  # one token a round


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(TEXTS)), data=st.data())
def test_random_rounds_concatenate_to_the_full_decode(tokenizer, name, data):
    ids = tokenizer.encode(TEXTS[name]) + [tokenizer.eos_token_id]  # <|im_end|> is skipped
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    _check(tokenizer, ids, cuts)


def test_a_generation_that_ends_mid_character_flushes_it(tokenizer):
    ids = tokenizer.encode("ok 😀")[:-1]  # the emoji's last byte never comes
    pieces = _stream(tokenizer, ids, list(range(len(ids))))
    assert pieces[-1].endswith(REPLACEMENT) and "".join(pieces) == tokenizer.decode(ids)
    assert not any(REPLACEMENT in p for p in pieces[:-1])  # held back until the end


def test_special_tokens_are_hidden_from_the_stream(tokenizer):
    ids = tokenizer.encode("Done.") + [tokenizer.eos_token_id]
    assert "".join(_stream(tokenizer, ids, list(range(len(ids))))) == "Done."


def test_labels_show_partial_characters_as_bytes(tokenizer):
    ids = tokenizer.encode("Hi 😀")
    labels = [token_text(tokenizer, i) for i in ids]
    assert labels == ["Hi", " \\xf0\\x9f\\x98", "\\x80"]
    assert token_text(tokenizer, tokenizer.eos_token_id) == "<|im_end|>"  # labels keep special tokens


class SubsetTokenizer:
    """The real tokenizer through a small vocabulary (tiny id i is real id ids[i]), so that a tiny
    random model writes real emoji, CJK and code pieces, special tokens among them."""
    chat_template = None

    def __init__(self, real, ids: list[int]) -> None:
        self.real, self.ids = real, ids
        self.eos_token_id, self.vocab_size = ids.index(real.eos_token_id), len(ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.real.decode([self.ids[i] for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token: int) -> str:
        return self.real.convert_ids_to_tokens(self.ids[token])


@pytest.mark.parametrize("mode", ["vanilla", "static", "dynamic"])
def test_decoder_records_concatenate_to_the_reply(tokenizer, mode):
    """A tiny random Llama, sampled, over the tokens of TEXTS: its rounds split characters anywhere
    and end mid-character; the records' new_text still concatenate to the reply's decode, and no
    node or bonus label shows U+FFFD."""
    real_ids = sorted({i for text in TEXTS.values() for i in tokenizer.encode(text)})
    tok = SubsetTokenizer(tokenizer, real_ids + [tokenizer.bos_token_id, tokenizer.eos_token_id])
    target = tiny_target(vocab=tok.vocab_size, seed=3, eos=tok.eos_token_id)
    target.tokenizer = tok
    head = None if mode == "vanilla" else new_head(target, seed=4)
    cfg = DecodeConfig(mode=mode, temperature=1.0, max_new_tokens=80, total_tokens=8, depth=3, top_k=4)
    g = generate(Decoder(target, head, cfg), [1, 2, 3])
    full = tok.decode(g.tokens, skip_special_tokens=True)
    assert "".join(s.new_text for s in g.steps) == full
    assert sum(REPLACEMENT in tok.decode([t]) for t in g.tokens) > 5  # it did write partial characters
    labels = [n.text for s in g.steps for n in s.nodes] + [s.bonus_text for s in g.steps]
    assert not any(REPLACEMENT in label for label in labels)
