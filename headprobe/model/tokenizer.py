"""Tokenizers behind one small interface: a file-free byte tokenizer and local ``tokenizer.json`` files.

Both provide ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``bos_id``,
``eos_id``, ``pad_id`` and ``name``. Nothing is ever downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Protocol, runtime_checkable

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import not_a


class TokenizerError(HeadprobeError, ValueError):
    """A tokenizer file that cannot be read as one."""


@runtime_checkable
class Tokenizer(Protocol):
    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

    def decode(self, ids: list[int]) -> str: ...

    @property
    def newline_ids(self) -> tuple[int, ...]: ...

    @property
    def fingerprint(self) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids ``0..255``; ids ``256..263`` are special.

    ``256`` = ``<bos>``, ``257`` = ``<eos>``, ``258`` = ``<pad>``, ``259..263`` reserved (they make the
    vocabulary 264, a multiple of 8). ``decode`` drops special ids and replaces invalid UTF-8.
    """

    name = "byte"
    vocab_size = 264
    bos_id = 256
    eos_id = 257
    pad_id = 258
    special_tokens: ClassVar[dict[str, int]] = {"<bos>": 256, "<eos>": 257, "<pad>": 258}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode("utf-8")) for t in texts]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, per id, the character span ``[start, end)`` of ``text`` it encodes (a character of
        several UTF-8 bytes gives each of its bytes that character's span)."""
        ids, offsets = [], []
        for i, char in enumerate(text):
            raw = char.encode("utf-8")
            ids += raw
            offsets += [(i, i + 1)] * len(raw)
        return ids, offsets

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def token_text(self, idx: int) -> str | None:
        """A special id's name (``<eos>``), a byte's character, ``None`` for a reserved id."""
        names = {v: k for k, v in self.special_tokens.items()}
        return names.get(idx) or (chr(idx) if 0 <= idx < 256 else None)

    @property
    def newline_ids(self) -> tuple[int, ...]:
        """Ids whose text contains a newline: the byte ``0x0A``."""
        return (10,)

    @property
    def fingerprint(self) -> str:
        """What tells this tokenizer from others (:attr:`HFTokenizer.fingerprint`): ``"byte"``."""
        return "byte"

    def __repr__(self) -> str:
        return "ByteTokenizer()"


# special-token spellings used by common tokenizer.json files
_BOS_NAMES = ("<|begin_of_text|>", "<bos>", "<s>", "<|startoftext|>")
_EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<eos>", "</s>", "<|im_end|>")
_PAD_NAMES = ("<pad>", "<|pad|>", "<|finetune_right_pad_id|>")


class HFTokenizer:
    """A local ``tokenizer.json`` loaded with the ``tokenizers`` library (no hub access)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as _Tok

        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if why := not_a(path, "file"):
            raise FileNotFoundError(f"tokenizer file {path} {why}")
        try:
            self._tok = _Tok.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception subclass
            raise TokenizerError(f"{path} is not a valid tokenizer.json: {err}") from None
        self.path = path
        self.name = str(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._first_id(_BOS_NAMES)
        self.eos_id = self._first_id(_EOS_NAMES)
        self.pad_id = self._first_id(_PAD_NAMES)

    def _first_id(self, names: tuple[str, ...]) -> int | None:
        for name in names:
            idx = self._tok.token_to_id(name)
            if idx is not None:
                return idx
        return None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def token_id(self, token: str) -> int | None:
        """The id of the vocabulary entry spelled ``token`` (e.g. ``<|im_end|>``), ``None`` if there is none."""
        return self._tok.token_to_id(token)

    def token_text(self, idx: int) -> str | None:
        """The vocabulary entry of id ``idx`` as spelled in the file (special tokens included)."""
        return self._tok.id_to_token(idx)

    @functools.cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the file's special added tokens (``<|im_end|>``, ``<eos>``...), which :meth:`decode` drops."""
        return frozenset(i for i, tok in self._tok.get_added_tokens_decoder().items() if tok.special)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, per id, the character span ``[start, end)`` of ``text`` it encodes."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    @functools.cached_property
    def newline_ids(self) -> tuple[int, ...]:
        """Ids whose text contains a newline (computed once over the vocabulary)."""
        return tuple(i for i in range(self.vocab_size) if "\n" in self.decode([i]))

    @functools.cached_property
    def fingerprint(self) -> str:
        """What tells this tokenizer from others, whatever file it was read from: ``vocab-sha256:`` and the
        first 16 hex digits of the SHA-256 of its vocabulary (every entry and id, added tokens included).
        Two files of one tokenizer (the original and a re-saved copy) have the same fingerprint."""
        entries = sorted(self._tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(json.dumps(entries, ensure_ascii=False).encode("utf-8")).hexdigest()
        return f"vocab-sha256:{digest[:16]}"

    @functools.cached_property
    def default_prefix(self) -> tuple[int, ...]:
        """The ids the file's post-processor puts before every text by default (e.g. Llama's BOS;
        nothing for GPT-2 or Qwen style tokenizers): how the model's own training inputs began."""
        bare = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        for at in range(len(full) - len(bare) + 1):
            if full[at : at + len(bare)] == bare:
                return tuple(full[:at])
        return ()

    def save(self, path: str | Path) -> None:
        self._tok.save(str(path))

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r})"


def span_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Per token (character span ``offsets[i]``): does it overlap one of the character ``spans``
    ``[start, end)``? Turns spans of a text into a per-token loss mask."""
    return [any(a < e and s < b for s, e in spans) for a, b in offsets]


def encode_spans(tokenizer: Tokenizer, text: str, spans: Sequence[tuple[int, int]]) -> tuple[list[int], list[bool]]:
    """``text``'s ids and, per id, whether it overlaps one of the character ``spans``."""
    ids, offsets = tokenizer.encode_offsets(text)
    return ids, span_mask(offsets, spans)


def load_tokenizer(spec: str | Path) -> ByteTokenizer | HFTokenizer:
    """``"byte"`` for the byte tokenizer, else a path to ``tokenizer.json`` or a folder holding one."""
    if str(spec) == "byte":
        return ByteTokenizer()
    return HFTokenizer(spec)
