"""Tokenizers turn text into int32 ids; the byte tokenizer round-trips any text without a download."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmfeed.codecs import ByteTokenizer, HFTokenizer, Tokenizer


@given(text=st.text(max_size=50))
def test_byte_tokenizer_round_trips_any_text_with_specials_around_it(text):
    tok = ByteTokenizer(bos_id=256, eos_id=257)
    ids = tok.encode(text)
    body = text.encode("utf-8")
    assert ids.dtype == np.int32 and ids.ndim == 1 and len(ids) == len(body) + 2
    assert ids[0] == 256 and ids[-1] == 257 and bytes(ids[1:-1].astype(np.uint8)) == body
    assert tok.decode(ids) == text
    assert ids.max() < tok.vocab_size


def test_byte_tokenizer_vocab_and_bad_settings():
    assert ByteTokenizer().vocab_size == 256 and ByteTokenizer().encode("").shape == (0,)
    assert ByteTokenizer(eos_id=300).vocab_size == 301
    assert isinstance(ByteTokenizer(), Tokenizer)
    with pytest.raises(ValueError, match="bos_id must be an int >= 256"):
        ByteTokenizer(bos_id=10)
    with pytest.raises(ValueError, match="must differ"):
        ByteTokenizer(bos_id=256, eos_id=256)
    with pytest.raises(TypeError, match="takes a str"):
        ByteTokenizer().encode(b"bytes")


def _word_level():
    tokenizers = pytest.importorskip("tokenizers", reason="the optional 'tokenizers' package is not installed")
    vocab = {"[UNK]": 0, "pick": 1, "up": 2, "the": 3, "cube": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok


def test_hf_tokenizer_adapter_built_in_process(tmp_path):
    tok = _word_level()  # built here from a tiny vocabulary: nothing is downloaded
    hf = HFTokenizer(tok)
    ids = hf.encode("pick up the red cube")
    assert ids.dtype == np.int32 and ids.tolist() == [1, 2, 3, 0, 4]
    assert hf.vocab_size == 5 and isinstance(hf, Tokenizer)
    tok.save(str(tmp_path / "tokenizer.json"))
    assert HFTokenizer.from_file(tmp_path / "tokenizer.json").encode("the cube").tolist() == [3, 4]
    with pytest.raises(TypeError, match="wraps a tokenizers.Tokenizer"):
        HFTokenizer(ByteTokenizer())
    with pytest.raises(ValueError, match="does not exist"):
        HFTokenizer.from_file(tmp_path / "missing.json")
