"""Where a model's answer ends: every end-of-text or end-of-turn id the model's files declare.

A Hugging Face folder may name its end ids in several places, and they need not agree: SmolLM2's
``tokenizer.json`` spells ``<|endoftext|>`` (id 0) while ``config.json``, ``generation_config.json`` and
``tokenizer_config.json`` say ``<|im_end|>`` (id 2), the end of a chat turn, which is what the instruct
model emits. Decoding that stops on one of them only runs on past the answer into invented turns. So
greedy decoding stops on the union, and each id keeps the list of files that declared it (recorded with
the results):

=======================  ======================================================================
generation_config.json   ``eos_token_id`` (an id or a list)
config.json              ``eos_token_id`` (also ``text_config.eos_token_id``)
tokenizer_config.json    ``eos_token`` (a string, or ``{"content": ...}``)
tokenizer.json           the end-of-text token among the usual spellings (:class:`HFTokenizer`)
chat template            the special token that ends an assistant turn (:func:`chat_turn_end`)
=======================  ======================================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.text.prompt_format import chat_turn_end

StopTokens = Mapping[int, tuple[str, ...]]  # id -> the files that declared it, in the table's order


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def declared_stop_tokens(folder: str | Path, tokenizer: HFTokenizer) -> StopTokens:
    """Every end id the model folder declares, each with the files that declare it (see the module
    docstring); ids outside the tokenizer's vocabulary are ignored."""
    folder = Path(folder)
    found: dict[int, list[str]] = {}

    def add(ids: list[int], source: str) -> None:
        for i in ids:
            if 0 <= i < tokenizer.vocab_size and source not in found.setdefault(i, []):
                found[i].append(source)

    add(_ids(_read_json(folder / "generation_config.json").get("eos_token_id")), "generation_config.json")
    config = _read_json(folder / "config.json")
    add(_ids(config.get("eos_token_id")) + _ids((config.get("text_config") or {}).get("eos_token_id")), "config.json")
    eos = _read_json(folder / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and (i := tokenizer.token_id(eos)) is not None:
        add([i], "tokenizer_config.json")
    if tokenizer.eos_id is not None:
        add([tokenizer.eos_id], "tokenizer.json")
    end = chat_turn_end(folder)
    if end:
        first = tokenizer.encode(end)[:1]
        if first and first[0] in tokenizer.special_ids:
            add(first, "chat template")
    return {i: tuple(sources) for i, sources in sorted(found.items())}


def describe_stops(stops: StopTokens, tokenizer: HFTokenizer | ByteTokenizer) -> dict[str, list[str]]:
    """``{token text: [files]}`` for the results' records (``id:N`` where a token has no text)."""
    return {tokenizer.token_text(i) or f"id:{i}": list(sources) for i, sources in stops.items()}
