"""Token shards against the original text, sampling against its definition, and bad data."""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from headprobe.model.tokenizer import ByteTokenizer, load_tokenizer
from headprobe.testing import build_toy_bpe
from headprobe.text import corpus as corpus
from trainer.data import DataError, PackedSequences, Sampler, TokenData, collate, prepare, shard_dtype, synth

DOCS = ["First document, plain text.\nWith two lines.", "Zweites Dokument — ümlauts and 東京.", "third"]


def write_sources(folder):
    (folder / "a.txt").write_text(DOCS[0], encoding="utf-8")
    (folder / "b.jsonl").write_text(json.dumps({"text": DOCS[1]}) + "\n\n" + json.dumps({"text": DOCS[2]}) + "\n")
    pd.DataFrame({"text": DOCS[::-1]}).to_parquet(folder / "c.parquet")
    return [folder / "a.txt", folder / "b.jsonl", folder / "c.parquet"]


def test_shards_round_trip_to_the_original_text(tmp_path):
    sources = write_sources(tmp_path)
    tok = ByteTokenizer()
    man = prepare(sources, tok, tmp_path / "data", shard_tokens=17)  # many tiny shards
    expected_docs = DOCS + DOCS[::-1]
    assert man.documents == 6 and len(man.shards) > 3 and man.dtype == "uint16"
    data = TokenData(tmp_path / "data", verify=True)
    stream = data.tokens(0, len(data)).tolist()
    # split on end-of-document ids and decode each piece
    pieces, cur = [], []
    for t in stream:
        if t == tok.eos_id:
            pieces.append(tok.decode(cur))
            cur = []
        else:
            cur.append(t)
    assert pieces == expected_docs and cur == []
    assert [s.documents for s in man.sources] == [1, 2, 3]


def test_bpe_round_trip_and_cross_shard_reads(tmp_path):
    tok = load_tokenizer(build_toy_bpe(tmp_path / "tok.json"))
    sources = write_sources(tmp_path)
    prepare(sources, tok, tmp_path / "data", shard_tokens=5)
    data = TokenData(tmp_path / "data")
    stream = np.concatenate([np.asarray([*tok.encode(d), tok.eos_id]) for d in DOCS + DOCS[::-1]])
    assert np.array_equal(data.tokens(0, len(data)), stream)
    assert np.array_equal(data.tokens(3, 23), stream[3:23])
    seqs = PackedSequences(data, seq_len=8)
    assert len(seqs) == (len(stream) - 1) // 8
    for i in (0, 1, len(seqs) - 1):
        assert np.array_equal(seqs[i], stream[i * 8 : i * 8 + 9])
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["extra"]["tokenizer_sha256"]


class _BigVocab(ByteTokenizer):
    vocab_size = 70_000


def test_dtype_choice_and_overflow(tmp_path):
    assert shard_dtype(264) == "uint16" and shard_dtype(65_536) == "uint16" and shard_dtype(65_537) == "uint32"
    with pytest.raises(DataError, match=r"holds only 65,536.*uint32"):
        prepare(write_sources(tmp_path), _BigVocab(), tmp_path / "d", dtype="uint16")
    assert prepare(write_sources(tmp_path), _BigVocab(), tmp_path / "d").dtype == "uint32"


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("empty.txt", b"", "is empty"),
        ("latin.txt", "caf\xe9".encode("latin-1"), r"latin\.txt is not UTF-8 text \(.* at byte 3\)"),
        ("bad.jsonl", b'{"txt": "x"}\n', r"bad\.jsonl:1: expected an object with a string 'text'"),
        ("broken.jsonl", b'{"text": \n', r"broken\.jsonl:1: not valid JSON"),
    ],
)
def test_bad_sources(tmp_path, name, content, match):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=match):
        prepare([tmp_path / name], ByteTokenizer(), tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_shard_that_does_not_match_its_manifest(tmp_path):
    prepare(write_sources(tmp_path), ByteTokenizer(), tmp_path / "data", shard_tokens=50)
    shard = tmp_path / "data" / "shard_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"shard_00001\.bin has 98 bytes.*does not match its manifest"):
        TokenData(tmp_path / "data")
    prepare(write_sources(tmp_path), ByteTokenizer(), tmp_path / "data2", shard_tokens=50)
    shard = tmp_path / "data2" / "shard_00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1
    shard.write_bytes(bytes(raw))
    TokenData(tmp_path / "data2")  # sizes still agree ...
    with pytest.raises(DataError, match="SHA-256 differs"):
        TokenData(tmp_path / "data2", verify=True)  # ... the checksum does not
    with pytest.raises(DataError, match="not a prepared data folder"):
        TokenData(tmp_path)


def test_sampler_is_a_pure_function_of_seed_and_step():
    s = Sampler(num_items=10, global_batch=4, seed=3)
    batches = [s.batch(step) for step in range(5)]  # 20 positions = two epochs
    assert np.array_equal(s.batch(3), Sampler(10, 4, 3).batch(3))
    first_epoch = np.concatenate(batches)[:10]
    second_epoch = np.concatenate(batches)[10:20]
    assert sorted(first_epoch) == list(range(10)) and sorted(second_epoch) == list(range(10))
    assert not np.array_equal(first_epoch, second_epoch)
    for world in (1, 2, 4):
        parts = [s.shard(7, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(parts), s.batch(7))
    assert not np.array_equal(Sampler(10, 4, 4).batch(0), s.batch(0))
    with pytest.raises(DataError, match="not divisible"):
        s.shard(0, 0, 3)


def test_collate_masks_padding():
    b = collate([(np.array([1, 2, 3, 4]), None), (np.array([5, 6, 7]), np.array([0, 0, 1], dtype=bool))], pad_id=9)
    assert b.inputs.tolist() == [[1, 2, 3], [5, 6, 9]]
    assert b.targets.tolist() == [[2, 3, 4], [6, 7, 9]]
    assert b.loss_mask.tolist() == [[True, True, True], [False, True, False]]


def test_synth_corpus(tmp_path):
    man = synth(20_000, tmp_path / "synth", seed=1)
    assert man.total_tokens >= 20_000 and set(man.extra["documents_by_kind"]) <= set(corpus.MIXTURE)
    assert man.extra["mixture"] == corpus.MIXTURE
    again = synth(20_000, tmp_path / "synth2", seed=1)
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in man.shards]  # deterministic


def _docs(kind, n=40):
    found = []
    i = 0
    while len(found) < n:
        k, text = corpus.document(5, i)
        if k == kind:
            found.append(text)
        i += 1
    return found


def test_kv_recall_answers_are_the_stated_facts():
    for doc in _docs("kv_recall"):
        facts = dict(re.findall(r"The special code for the (\w+ \w+) is (\d{7})\.", doc))
        qa = re.findall(r"Question: What is the special code for the (\w+ \w+)\? Answer: (\d{7})\.", doc)
        assert qa and all(facts[k] == v for k, v in qa)
        first_question = doc.index("Question:")
        assert all(doc.index(f"for the {k} is") < first_question for k in facts)


def test_var_chain_answers_follow_the_chain():
    for doc in _docs("var_chain"):
        values = dict(re.findall(r"VAR (\w{5}) = (\d+)\.", doc))
        links = re.findall(r"VAR (\w{5}) = VAR (\w{5})\.", doc)
        for _ in links:  # resolve every copy by following assignments in order
            for dst, src in links:
                if src in values:
                    values[dst] = values[src]
        question = doc[doc.index("Question:") :]
        if m := re.match(r"Question: What is the value of (\w{5})\? Answer: (\d+)\.", question):
            assert values[m.group(1)] == m.group(2)
        else:
            m = re.match(
                r"Question: Find all variables that are assigned the value (\d+)\. Answer: ([A-Z ]+)\.",
                question,
            )
            assert m and sorted(m.group(2).split()) == sorted(k for k, v in values.items() if v == m.group(1))


def test_word_count_answers_are_the_most_common():
    for doc in _docs("word_count", 20):
        listing = doc[: doc.index("Question:")]
        counts = Counter(re.findall(r"\d+\. (\w+)", listing))
        answer = doc[doc.index("are: ") + 5 : -1].split(", ")
        assert answer == [w for w, _ in counts.most_common(3)]


def _stream_with_masks(data: TokenData) -> tuple[list[int], list[bool]]:
    return data.tokens(0, len(data)).tolist(), data.masks(0, len(data)).tolist()


def test_loss_spans_become_token_masks_stored_with_the_shards(tmp_path):
    """Plain documents first (their shards get all-ones masks when the first masked document arrives),
    then JSONL documents with loss_spans: exactly the tokens inside the spans are targets."""
    (tmp_path / "a.txt").write_text("plain words " * 5)
    masked = [
        {"text": "Q: the cup? A: 4471", "loss_spans": [[14, 19]]},
        {"text": "no spans here"},
        {"text": "x1 y2 z3", "loss_spans": [[0, 2], [6, 8]]},
    ]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in masked))
    tok = ByteTokenizer()
    prepare([tmp_path / "a.txt", tmp_path / "b.jsonl"], tok, tmp_path / "data", shard_tokens=16)
    data = TokenData(tmp_path / "data", verify=True)
    assert all(s.mask_file for s in data.manifest.shards)
    ids, mask = _stream_with_masks(data)
    docs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        cur.append((t, m))
        if t == tok.eos_id:
            docs.append(cur)
            cur = []
    plain, spans, nospans, two = docs
    assert all(m for _, m in plain)  # written before any mask existed: every token counts, its EOS too
    assert tok.decode([t for t, m in spans if m]) == " 4471" and not spans[-1][1]  # EOS of a masked doc: no
    assert all(m for _, m in nospans)
    assert tok.decode([t for t, m in two if m]) == "x1z3"
    seq = PackedSequences(data, seq_len=8).item(0)
    assert np.array_equal(seq[1], np.asarray(mask[:9]))
    batch = collate([seq], pad_id=tok.pad_id)
    assert batch.target_tokens == sum(mask[1:9])  # the loss counts the stored targets only


def test_bad_loss_spans_and_damaged_masks_are_named(tmp_path):
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "abc", "loss_spans": [[2, 9]]}) + "\n")
    with pytest.raises(DataError, match=r"b\.jsonl:1: loss_spans must be .* <= 3"):
        prepare([tmp_path / "b.jsonl"], ByteTokenizer(), tmp_path / "d")
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "abcdef", "loss_spans": [[1, 2]]}) + "\n")
    prepare([tmp_path / "c.jsonl"], ByteTokenizer(), tmp_path / "e")
    (tmp_path / "e" / "mask_00000.bin").write_bytes(b"\x01")
    with pytest.raises(DataError, match=r"loss mask of shard_00000\.bin is missing or of the wrong size"):
        TokenData(tmp_path / "e")


def test_synth_tasks_store_their_answers_as_targets(tmp_path):
    from headprobe.text.tasks import Task, TaskMix, TaskSettings

    mix = TaskMix({Task.NEEDLE: 1, Task.PROSE: 1}, TaskSettings(distance=(50, 80)))
    man = synth(20_000, tmp_path / "t", tasks=mix, seed=3)
    assert man.extra["kind"] == "tasks" and man.extra["tasks"]["weights"] == {"needle": 1.0, "prose": 1.0}
    ids, mask = _stream_with_masks(TokenData(tmp_path / "t", verify=True))
    tok = ByteTokenizer()
    text = tok.decode(ids)
    answers = re.findall(r"Answer: The code for the \w+ \w+ is (\d{4})\.", text)
    targets = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert answers and all(f" {a}" in targets for a in answers)
    assert sum(mask) < 0.9 * len(mask) and sum(mask) > 0.2 * len(mask)  # prose counts, needle context does not
