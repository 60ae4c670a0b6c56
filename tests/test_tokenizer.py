import pytest
from tokenizers import Tokenizer

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer
from headprobe.testing import build_toy_bpe


def test_byte_round_trip_and_ids():
    tok = ByteTokenizer()
    text = "naïve café — 東京 \n\t"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode([*ids, tok.eos_id, tok.pad_id]) == text
    assert tok.vocab_size == 264 and {tok.bos_id, tok.eos_id, tok.pad_id} == {256, 257, 258}
    assert tok.decode([0xE6, 0x9D]) == "\ufffd"  # a cut multi-byte character is replaced, not an error


def test_hf_tokenizer_from_local_file(tmp_path):
    path = build_toy_bpe(tmp_path / "tokenizer.json")
    tok = load_tokenizer(path)
    assert isinstance(tok, HFTokenizer)
    assert tok.eos_id == Tokenizer.from_file(str(path)).token_to_id("<|endoftext|>")
    assert tok.pad_id is not None and tok.bos_id is None
    text = "the north door is quiet"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text)  # merges were learned
    assert load_tokenizer(tmp_path).vocab_size == tok.vocab_size  # a folder works too


def test_tokenizer_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(bad)


def test_byte_offsets_and_span_masks_hand_worked():
    from headprobe.model.tokenizer import encode_spans

    tok = ByteTokenizer()
    ids, offsets = tok.encode_offsets("hé!")
    assert ids == [104, 0xC3, 0xA9, 33] and offsets == [(0, 1), (1, 2), (1, 2), (2, 3)]
    assert encode_spans(tok, "hé!", [(1, 2)]) == (ids, [False, True, True, False])
    assert encode_spans(tok, "hé!", [(0, 1), (2, 3)])[1] == [True, False, False, True]
    assert encode_spans(tok, "hé!", [])[1] == [False] * 4


def test_bpe_offsets_cover_the_text_and_masks_follow_them(tmp_path):
    from headprobe.model.tokenizer import encode_spans

    tok = load_tokenizer(build_toy_bpe(tmp_path / "tokenizer.json"))
    text = "the key for the north door is 4471. Answer: 4471"
    ids, offsets = tok.encode_offsets(text)
    assert ids == tok.encode(text)
    assert "".join(text[a:b] for a, b in offsets) == text  # the tokens tile the text
    start = text.rindex(" 4471")
    ids, mask = encode_spans(tok, text, [(start, len(text))])
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == " 4471"
    assert not any(mask[: len(tok.encode(text[:start]))])


def test_toy_tokenizer_is_built_the_same_and_cached(tmp_path, monkeypatch):
    from headprobe.model.presets import TOY_VOCAB_SIZE, preset
    from headprobe.text.toy_tokenizer import build_toy_tokenizer, open_tokenizer, toy_tokenizer_path

    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path))
    tok = open_tokenizer("toy")
    assert tok.name == "toy" and tok.vocab_size == TOY_VOCAB_SIZE == preset("toy-d64").vocab_size
    path = toy_tokenizer_path()
    assert path.parent == tmp_path and tok.path == path
    built = path.stat().st_mtime_ns
    assert build_toy_tokenizer().to_str() == path.read_text()  # deterministic: a rebuild is the same file
    open_tokenizer("toy")
    assert path.stat().st_mtime_ns == built  # the cached file is reused
    assert isinstance(open_tokenizer("byte"), ByteTokenizer)


def test_toy_tokenizer_splits_digits_with_their_space_and_round_trips():
    from headprobe.text.tasks import TaskMix
    from headprobe.text.toy_tokenizer import open_tokenizer

    tok = open_tokenizer("toy")
    pieces = [tok.decode([i]) for i in tok.encode("The code for the red cup is 4471.")]
    assert pieces[-5:] == [" 4", "4", "7", "1", "."]  # a value is one token per digit, the first with its space
    assert " red" in pieces and " code" in pieces  # common words are single tokens
    mix = TaskMix.parse("copy=1,recall=1,needle=1,magic=1,prose=1")
    for i in range(20):
        text = mix.example(123, i).text
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert len(ids) < len(text) / 2  # several characters per token (digits are one each)
