"""Text to token ids: a :class:`Tokenizer` protocol, a byte-level tokenizer that needs no download, and an
adapter for a Hugging Face ``tokenizers.Tokenizer`` (an optional dependency, imported only when used).

>>> tok = ByteTokenizer(bos_id=256, eos_id=257)
>>> tok.encode("hi").tolist(), tok.vocab_size
([256, 104, 105, 257], 258)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ByteTokenizer", "FixedLengthTokenizer", "HFTokenizer", "Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """Anything with ``encode(text) -> int32 [N]`` token ids."""

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` as a 1-D int32 array."""
        ...


@dataclass(frozen=True, kw_only=True)
class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, with optional ``bos_id``/``eos_id`` (>= 256) added around every text.

    ``vocab_size`` is 256 plus room for the special ids.
    """

    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 256):
                raise ValueError(f"{name} must be an int >= 256 (0..255 are the byte ids), got {value!r}")
        if self.bos_id is not None and self.bos_id == self.eos_id:
            raise ValueError(f"bos_id and eos_id must differ, both are {self.bos_id}")

    @property
    def vocab_size(self) -> int:
        """Ids in use: the 256 bytes and any special ids."""
        return max([256] + [v + 1 for v in (self.bos_id, self.eos_id) if v is not None])

    def encode(self, text: str) -> np.ndarray:
        """int32 ids: optional BOS, the UTF-8 bytes of ``text``, optional EOS."""
        if not isinstance(text, str):
            raise TypeError(f"ByteTokenizer.encode takes a str, got {type(text).__name__}")
        body = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        out = np.empty(len(body) + (self.bos_id is not None) + (self.eos_id is not None), dtype=np.int32)
        start = 0
        if self.bos_id is not None:
            out[0] = self.bos_id
            start = 1
        out[start : start + len(body)] = body
        if self.eos_id is not None:
            out[-1] = self.eos_id
        return out

    def decode(self, ids: Any) -> str:
        """The text of ``ids``, special ids dropped (bytes that are not valid UTF-8 become U+FFFD)."""
        arr = np.asarray(ids, dtype=np.int64)
        return arr[(arr >= 0) & (arr < 256)].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer:
    """Adapter from a Hugging Face ``tokenizers.Tokenizer`` to the :class:`Tokenizer` protocol.

    ``tokenizers`` is optional: it is imported only here, and a clear ImportError says how to install it.
    """

    def __init__(self, tokenizer: Any, *, add_special_tokens: bool = True) -> None:
        tokenizers = _import_tokenizers()
        if not isinstance(tokenizer, tokenizers.Tokenizer):
            raise TypeError(
                f"HFTokenizer wraps a tokenizers.Tokenizer, got {type(tokenizer).__name__}; load one with "
                "HFTokenizer.from_file(path)"
            )
        self.tokenizer = tokenizer
        self.add_special_tokens = add_special_tokens

    @classmethod
    def from_file(cls, path: str | os.PathLike, *, add_special_tokens: bool = True) -> "HFTokenizer":
        """Load a ``tokenizer.json`` from a local path (never from the network)."""
        tokenizers = _import_tokenizers()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer file {path!r} does not exist; give the path of a tokenizer.json")
        return cls(tokenizers.Tokenizer.from_file(path), add_special_tokens=add_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Size of the wrapped tokenizer's vocabulary, added tokens included."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> np.ndarray:
        """int32 ids of ``text``."""
        if not isinstance(text, str):
            raise TypeError(f"HFTokenizer.encode takes a str, got {type(text).__name__}")
        ids = self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids
        return np.asarray(ids, dtype=np.int32)


@dataclass(frozen=True)
class FixedLengthTokenizer:
    """Every text as exactly ``length`` ids: ``base``'s ids cut after ``length`` or padded with ``pad_id``.

    What VLA policies do with their prompt (a fixed text budget, e.g. 48 tokens). With it, per-frame windows of
    one dataset all cost the same tokens, and the planned loader plans them arithmetically, storing nothing per
    window (:class:`mmfeed.packing.uniform.UniformPlan`).

    >>> FixedLengthTokenizer(ByteTokenizer(), 4, pad_id=0).encode("hello").tolist()
    [104, 101, 108, 108]
    """

    base: Any
    length: int
    pad_id: int

    def __post_init__(self) -> None:
        if not callable(getattr(self.base, "encode", None)):
            raise TypeError(f"base must have encode(text) -> ids, got {type(self.base).__name__}")
        for name in ("length", "pad_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "length" else 0):
                raise ValueError(f"{name} must be an int >= {1 if name == 'length' else 0}, got {value!r}")

    @property
    def vocab_size(self) -> int:
        """The base's vocabulary, widened to hold ``pad_id``."""
        return max(int(getattr(self.base, "vocab_size", 0)), self.pad_id + 1)

    def encode(self, text: str) -> np.ndarray:
        """int32 ``[length]`` ids."""
        ids = np.asarray(self.base.encode(text), dtype=np.int32)[: self.length]
        if len(ids) < self.length:
            ids = np.concatenate([ids, np.full(self.length - len(ids), self.pad_id, dtype=np.int32)])
        return ids


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError as exc:
        raise ImportError(
            "HFTokenizer needs the optional 'tokenizers' package: pip install tokenizers "
            "(or use mmfeed.codecs.ByteTokenizer, which needs nothing)"
        ) from exc
    return tokenizers
