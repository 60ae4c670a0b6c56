import json

import numpy as np
import pytest

from headprobe.model.tokenizer import ByteTokenizer
from trainer.data import DataError
from trainer.sft import Example, builtin_examples, encode, load_jsonl


def test_mask_covers_response_and_eos_only():
    tok = ByteTokenizer()
    tokens, mask = encode(Example("Q: hi?", " yo"), tok, seq_len=64)
    assert tokens.tolist() == [*b"Q: hi?", *b" yo", tok.eos_id]
    assert mask.tolist() == [False] * 6 + [True] * 4


def test_truncation_drops_prompt_from_the_left():
    tok = ByteTokenizer()
    tokens, mask = encode(Example("abcdefghij", "XYZ"), tok, seq_len=7)  # 8 tokens fit
    assert tokens.tolist() == [*b"ghij", *b"XYZ", tok.eos_id]
    assert mask.sum() == 4
    tokens, mask = encode(Example("abc", "0123456789"), tok, seq_len=5)  # response alone too long
    assert tokens.tolist() == [*b"c", *b"01234"] and mask.tolist() == [False] + [True] * 5


def test_builtin_examples_are_answerable():
    examples = builtin_examples(60, seed=2)
    assert len({e.prompt for e in examples}) == 60
    for e in examples:
        assert e.prompt.endswith("Answer:") and e.response.startswith(" ")
        if e.prompt.startswith("Repeat these words in order:"):
            listed = e.prompt.split(": ", 1)[1].rsplit(". Answer:", 1)[0]
            assert e.response.strip().rstrip(".") == listed
        if "What is the special code for the" in e.prompt:
            key = e.prompt.rsplit("special code for the ", 1)[1].split("?")[0]
            assert f"The special code for the {key} is {e.response.strip().rstrip('.')}." in e.prompt


def test_jsonl_errors(tmp_path):
    good = tmp_path / "sft.jsonl"
    good.write_text(json.dumps({"prompt": "a", "response": "b"}) + "\n")
    assert load_jsonl(good) == [Example("a", "b")]
    for content, match in [
        ('{"prompt": "a"}', "string fields 'prompt' and 'response'"),
        ('{"prompt": "a", "response": ""}', "empty response"),
        ("", "holds no examples"),
        ("{oops", "not valid JSON"),
    ]:
        path = tmp_path / "bad.jsonl"
        path.write_text(content)
        with pytest.raises(DataError, match=match):
            load_jsonl(path)
    with pytest.raises(DataError, match="does not exist"):
        load_jsonl(tmp_path / "missing.jsonl")
    assert np.dtype(bool) == encode(Example("a", "b"), ByteTokenizer(), 8)[1].dtype
