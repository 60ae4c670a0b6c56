"""Synthetic retrieval tasks: each document is parsed back here and its loss spans checked against what
the text says (the answer really is the earlier value; the copy really is the segment)."""

from __future__ import annotations

import re

import pytest

from headprobe.model.tokenizer import ByteTokenizer, encode_spans
from headprobe.text.tasks import Split, Task, TaskMix, TaskSettings, keys
from headprobe.text.wordlists import words


def mix(task: Task, **settings) -> TaskMix:
    return TaskMix({task: 1.0}, TaskSettings(**settings))


def test_copy_repeats_its_segment_and_the_loss_counts_the_repeat():
    m = mix(Task.COPY, distance=(100, 200), segment=(16, 32))
    firsts = set()
    for i in range(40):
        ex = m.example(0, i)
        ((start, end),) = ex.loss_spans
        cue_start = ex.text.rindex(" ", 0, start) + 1  # the repeat's first word is its cue, not a target
        segment = ex.text[cue_start:end]
        assert end == len(ex.text) and ex.text[start] == " " and " " in segment
        assert len(segment) <= 32 or len(segment.split()) == 2  # two words may be longer
        first = ex.text.index(segment + " ")
        assert first < cue_start and first <= 200 // 4 + 1  # it occurred before, after a short lead of prose
        gap = cue_start - (first + len(segment)) - 2
        assert 100 - 1 <= gap <= 200, gap  # the gap (prose cut to length) lies in the distance range
        firsts.add(first)
    assert len(firsts) > 20  # segments start at many places, not at the document's start


def test_recall_values_are_those_of_their_keys():
    m = mix(Task.RECALL, distance=(50, 60), pairs=(3, 6), queries=2)
    for i in range(40):
        ex = m.example(1, i)
        listed = dict(re.findall(r"([a-z]+ [a-z]+) (\d{4})", ex.text.split(". ", 1)[0]))
        assert 3 <= len(listed) <= 6
        recall = ex.text[ex.text.index(" Recall:") :]
        asked = re.findall(r"([a-z]+ [a-z]+) (\d{4})", recall)
        assert len(asked) == len(ex.loss_spans) == 2
        for (key, value), (start, end) in zip(asked, ex.loss_spans, strict=True):
            assert listed[key] == value and ex.text[start:end] == " " + value


def test_needle_answers_the_question_from_the_fact():
    m = mix(Task.NEEDLE, distance=(300, 400), pairs=(1, 3))
    for i in range(40):
        ex = m.example(2, i)
        facts = dict(re.findall(r"The code for the ([a-z]+ [a-z]+) is (\d{4})\.", ex.text))
        key = re.search(r"What is the code for the ([a-z]+ [a-z]+)\? Answer:", ex.text).group(1)
        ((start, end),) = ex.loss_spans  # the value only; the restatement before it is context
        assert ex.text[:start].endswith(f"Answer: The code for the {key} is")
        assert ex.text[start:end] == " " + facts[key] and ex.text.endswith(facts[key] + ".")
        fact_end = ex.text.index(f"The code for the {key} is") + len(f"The code for the {key} is {facts[key]}.")
        assert ex.text.index("Question:") - fact_end >= 300 - 1  # at least the distance apart


def test_splits_use_disjoint_keys():
    train = {ex.text for i in range(5) for ex in [mix(Task.NEEDLE).example(0, i)]}
    heldout_keys, train_keys = set(keys(Split.HELDOUT)), set(keys(Split.TRAIN))
    assert not heldout_keys & train_keys and heldout_keys | train_keys == set(words("nouns"))
    for i in range(30):
        ex = mix(Task.NEEDLE, split="heldout").example(0, i)
        for key in re.findall(r"The code for the [a-z]+ ([a-z]+) is", ex.text):
            assert key in heldout_keys
    assert train


def test_deterministic_in_seed_and_index_and_prose_counts_everything():
    m = TaskMix({Task.COPY: 1, Task.NEEDLE: 1, Task.PROSE: 2})
    assert m.example(3, 7) == m.example(3, 7) and m.example(3, 7) != m.example(3, 8)
    kinds = {m.example(0, i).kind for i in range(60)}
    assert kinds == {"copy", "needle", "prose"}
    prose = next(m.example(0, i) for i in range(60) if m.example(0, i).kind == "prose")
    assert prose.loss_spans == ()


def test_byte_masks_cover_exactly_the_answer():
    ex = mix(Task.NEEDLE).example(4, 0)
    ids, mask = encode_spans(ByteTokenizer(), ex.text, ex.loss_spans)
    answer = ex.text[ex.loss_spans[0][0] : ex.loss_spans[-1][1]]
    assert bytes(i for i, m in zip(ids, mask, strict=True) if m).decode() == answer


@pytest.mark.parametrize("bad", [dict(distance=(5, 1)), dict(pairs=(0, 2)), dict(queries=0), dict(split="test")])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        TaskSettings(**bad)


def test_magic_needles_are_rulers_phrasing_and_the_loss_counts_the_number():
    from headprobe.evals.ruler.templates import NIAH_NEEDLE, NIAH_PREFIX, NIAH_TEMPLATE

    m = mix(Task.MAGIC, distance=(200, 300), pairs=(1, 3))
    for i in range(30):
        ex = m.example(5, i)
        facts = dict(re.findall(r"special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", ex.text))
        key = re.search(r"What are all the special magic numbers for ([a-z]+-[a-z]+) mentioned", ex.text).group(1)
        for k, v in facts.items():
            assert NIAH_NEEDLE.format(type_needle_v="numbers", key=k, value=v) in ex.text
        question = NIAH_TEMPLATE.split("\n")[-1].format(type_needle_v="numbers", query=key)
        prefix = NIAH_PREFIX.format(type_needle_v="numbers", query=key)
        ((start, end),) = ex.loss_spans
        assert ex.text[:start].endswith(question + prefix) and ex.text[start:end] == " " + facts[key]


def test_repeat_is_a_symbol_string_twice_and_the_loss_counts_the_repeat_after_its_first_symbol():
    from headprobe.text.tasks import SYMBOLS

    m = mix(Task.REPEAT, segment=(5, 9))
    for i in range(30):
        ex = m.example(6, i)
        n = len(ex.text) // 2
        assert 5 <= n <= 9 and ex.text[:n] == ex.text[n:] and set(ex.text) <= set(SYMBOLS)
        assert ex.loss_spans == ((n + 1, 2 * n),)
    assert len(SYMBOLS) == 64 and set("0123456789") <= set(SYMBOLS)


def test_list_is_nouns_a_gap_of_prose_and_the_same_nouns_with_the_loss_after_the_first():
    m = mix(Task.LIST, distance=(40, 80), segment=(20, 40))
    nouns = set(words("nouns"))
    for i in range(30):
        ex = m.example(3, i)
        ((start, end),) = ex.loss_spans
        cue = ex.text.rindex(" ", 0, start) + 1
        repeat = ex.text[cue:end]
        assert end == len(ex.text) and ex.text.startswith(repeat + " ")  # the list opens the document
        items = repeat.split(" ")
        assert len(items) >= 2 and set(items) <= nouns and (len(repeat) >= 20 or len(items) == 2)
        assert ex.text[start:end] == repeat[len(items[0]) :]  # every noun but the cue is a target
        gap = ex.text[len(repeat) + 1 : cue - 1]
        assert 40 - 2 <= len(gap) <= 80, len(gap)  # the prose between (cut to length, stripped)
