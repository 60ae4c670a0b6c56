"""Curricula, their rows and state, in-training probes, and a curriculum run resumed exactly."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from headprobe.model.answers import answer_loss, exact_share
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config
from headprobe.text.probes import Probe, TaskProbeError
from headprobe.text.tasks import Task
from trainer.config import TrainConfig, TrainError
from trainer.curriculum import Curriculum, CurriculumSource, CurriculumState
from trainer.train import train

NEEDLES = {"tasks": {"needle": 1}, "levels": [{"distance": [0, 20], "pairs": [1, 1]}, {"distance": [100, 120]}]}


def test_levels_grow_geometrically_or_inherit_fields():
    c = Curriculum.from_dict({"tasks": {"copy": 1}, "grow": {"distance": [16, 100], "factor": 2}})
    assert [lv.distance for lv in c.levels] == [(8, 16), (16, 32), (32, 64), (50, 100)]
    assert [lv.segment for lv in c.levels] == [(8, 16), (8, 32), (8, 64), (8, 96)]  # capped at segment_max
    c = Curriculum.from_dict(NEEDLES)
    assert c.levels[1].distance == (100, 120) and c.levels[1].pairs == (1, 1)  # inherited
    assert c.accuracy == 0.85 and c.window == 20 and c.steps is None


def test_listed_levels_come_first_with_their_own_tasks_then_the_grown_ones():
    raw = {
        "tasks": {"needle": 1},
        "levels": [{"tasks": {"copy": 1}, "distance": [0, 8], "segment": [32, 64]}, {"distance": [8, 16]}],
        "grow": {"distance": [64, 128], "factor": 2},
    }
    c = Curriculum.from_dict(raw)
    assert [lv.distance for lv in c.levels] == [(0, 8), (8, 16), (32, 64), (64, 128)]
    assert c.levels[1].segment == (32, 64)  # inherited from the level before
    assert [set(c.mix(i).weights) for i in range(4)] == [{Task.COPY}, {Task.COPY}, {Task.NEEDLE}, {Task.NEEDLE}]
    assert {c.mix(0).example(0, i).kind for i in range(10)} == {"copy"}


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"tasks": {"copy": 1}}, "give `levels`"),
        ({"levels": [{"distance": [0, 8]}]}, "task mix needs"),  # no tasks anywhere
        ({"tasks": {"sing": 1}, "levels": [{}]}, "unknown task 'sing'"),
        ({"tasks": {"copy": 1}, "levels": [{"depth": 3}]}, "unknown level fields"),
        ({"tasks": {"copy": 1}, "levels": [{"accuracy": 1.5}]}, "advance threshold in"),
        ({"tasks": {"copy": 1}, "levels": [{}], "advance": {"steps": 5, "accuracy": 0.5}}, "advance is"),
        ({"tasks": {"copy": 1}, "levels": [{}], "advance": {"probe": "copy@300", "accuracy": 0.5}}, "advance is"),
        ({"tasks": {"copy": 1}, "levels": [{}], "advance": {"probe": "copy@300", "window": 3}}, "advance is"),
        ({"tasks": {"copy": 1}, "levels": [{}], "advance": {"probe": "copy", "accuracy": 0.5, "every": 5}}, "task@"),
        ({"tasks": {"copy": 1}, "levels": [{}], "advance": {"probe": "copy@9", "accuracy": 0.5, "every": 0}}, ">= 1"),
        ({"tasks": {"copy": 1}, "levels": [{"probe": "copy@300"}]}, "level's `probe` needs"),
        ({"tasks": {"copy": 1}, "levels": [{}], "speed": 1}, "unknown fields"),
        ({"tasks": {"copy": 1}, "levels": [{}], "prose": 1.0}, "prose is the share"),
    ],
)
def test_bad_curricula_are_refused(raw, match):
    with pytest.raises(TrainError, match=match):
        Curriculum.from_dict(raw)


def test_state_advances_on_accuracy_or_schedule():
    c = Curriculum.from_dict({**NEEDLES, "advance": {"accuracy": 0.5, "window": 3}})
    state = CurriculumState()
    moves = [state.observe(step, acc, c) for step, acc in enumerate([0.9, 0.2, 0.2, 0.9, 0.9, 0.9, 0.9])]
    # means of the last 3: -, -, 0.43, 0.43, 0.67 (> 0.5: advance after step 4); then the last level is final
    assert moves == [False, False, False, False, True, False, False] and (state.level, state.since) == (1, 5)
    own = {
        **NEEDLES,
        "levels": [{**NEEDLES["levels"][0], "accuracy": 0.3}, {}, {}],
        "advance": {"accuracy": 0.5, "window": 3},
    }
    c = Curriculum.from_dict(own)
    state = CurriculumState()
    # level 0 has its own threshold 0.3: the mean 0.33 passes it after step 2; level 1 needs 0.5 again:
    # 0.4 (steps 3-5) does not, 0.57 (steps 4-6) does; level 2 is the last
    moves = [state.observe(step, acc, c) for step, acc in enumerate([0.4, 0.3, 0.3, 0.4, 0.4, 0.4, 0.9, 0.9])]
    assert moves == [False, False, True, False, False, False, True, False] and state.level == 2
    c = Curriculum.from_dict({**NEEDLES, "levels": [*NEEDLES["levels"], {}], "advance": {"steps": 2}})
    state = CurriculumState()
    assert [state.observe(s, 0.0, c) for s in range(6)] == [False, True, False, True, False, False]
    assert CurriculumState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


PROBED = {
    **NEEDLES,
    "levels": [*NEEDLES["levels"], {"probe": "copy@400", "accuracy": 0.6}, {}],
    "advance": {"probe": "needle@300", "accuracy": 0.5, "every": 4},
}


def test_a_probe_driven_curriculum_advances_on_the_held_out_score_not_training_accuracy():
    c = Curriculum.from_dict(PROBED)
    state = CurriculumState()
    assert not any(state.observe(step, 1.0, c) for step in range(50))  # perfect training accuracy: no move
    assert c.advance_probe(0) == Probe.parse("needle@300") and c.advance_probe(2) == Probe.parse("copy@400")
    # level 0 and 1 need more than 0.5 on needle@300; level 2 its own 0.6 on copy@400; level 3 is the last
    scores = [0.5, 0.56, 0.2, 0.9, 0.6, 0.61, 1.0]
    moves = [state.observe_probe(4 * (i + 1) - 1, s, c) for i, s in enumerate(scores)]
    assert moves == [False, True, False, True, False, True, False] and state.level == 3
    assert state.since == 24  # advanced after the probe at step 24 (0-based 23)


def test_rows_pack_examples_with_their_answers_as_targets():
    tok = ByteTokenizer()
    source = CurriculumSource(Curriculum.from_dict(NEEDLES), tok, seq_len=512, seed=0)
    tokens, mask = source.row(3, 1)
    assert len(tokens) == len(mask) == 513 and tokens[0] == tok.eos_id
    text = tok.decode([t for t in tokens.tolist()])
    targets = tok.decode([t for t, m in zip(tokens.tolist(), mask.tolist(), strict=True) if m])
    answers = re.findall(r"Answer: The code for the \w+ \w+ is( \d{4})\.", text)  # complete examples only
    assert answers and targets.startswith("".join(answers))  # exactly the answers are targets
    again = source.row(3, 1)
    assert (again[0] == tokens).all() and (source.row(3, 2)[0] != tokens).any()  # deterministic per (step, row)
    source.state.level = 1  # a harder level: facts far from their questions
    far = tok.decode(source.row(3, 1)[0].tolist())
    assert far != text


def test_short_row_levels_cut_each_row_into_rows_packed_apart():
    tok = ByteTokenizer()
    raw = {
        "tasks": {"copy": 1},
        "levels": [{"tasks": {"repeat": 1}, "segment": [4, 8], "row": 40}, {"segment": [6, 10]}, {"row": None}],
    }
    c = Curriculum.from_dict(raw)
    assert c.level_rows == (40, 40, None)  # inherited, then back to full rows
    source = CurriculumSource(c, tok, seq_len=128, seed=0)
    batches = source.micro_batches(0, 0, 1, batch_size=4, micro=2)
    # 129 tokens per full row -> 3 rows of 41; a micro-batch of 2 full rows -> 6 rows of 40 inputs
    assert [b.inputs.shape for b in batches] == [(6, 40), (6, 40)]
    for b in batches:
        assert (b.inputs[:, 0] == tok.eos_id).all()  # every row starts afresh
        for row, mask in zip(b.inputs.tolist(), b.loss_mask.tolist(), strict=True):
            docs, doc = [], []
            for t in row:
                if t == tok.eos_id:
                    docs, doc = [*docs, doc], []
                else:
                    doc.append(t)
            for whole in docs[1:]:  # complete examples (the first list is empty, the last may be cut)
                half = len(whole) // 2
                assert len(whole) >= 8 and whole[:half] == whole[half:]  # a segment twice, within this row
            assert any(mask)
    pieces = source.rows(0, 0)
    seen = [tok.decode(t.tolist()) for t, _ in pieces]
    assert len(set(seen)) == 3  # three different rows, not one row repeated
    source.state.level = 2
    assert [b.inputs.shape for b in source.micro_batches(0, 0, 1, 4, 2)] == [(2, 128), (2, 128)]
    with pytest.raises(TrainError, match="row` is tokens per row"):
        Curriculum.from_dict({**raw, "levels": [{"row": 2.5}]})
    long = {"tasks": {"repeat": 1}, "levels": [{"segment": [30, 40], "row": 40}]}
    with pytest.raises(TrainError, match="longer than the level's `row` 40; raise the level's `row`"):
        CurriculumSource(Curriculum.from_dict(long), tok, seq_len=128, seed=0).rows(0, 0)


def test_probe_prompts_end_where_the_answer_begins_and_score_exact_answers():
    tok = ByteTokenizer()
    probe = Probe.parse("needle@300")
    assert probe.task is Task.NEEDLE and probe.name == "probe/needle@300"
    for prompt, answer in probe.prompts(tok):
        text = tok.decode(prompt)
        key = re.search(r"What is the code for the (\w+ \w+)\?", text).group(1)
        assert text.endswith(f"Answer: The code for the {key} is") and re.fullmatch(r" \d{4}", tok.decode(answer))
        assert f"The code for the {key} is{tok.decode(answer)}." in text

    class Oracle(torch.nn.Module):  # answers from the prompt's own fact, or wrongly
        def __init__(self, right: bool) -> None:
            super().__init__()
            self.w, self.right = torch.nn.Parameter(torch.zeros(1)), right

        def generate(self, ids, n):
            text = tok.decode(ids[0].tolist())
            key = re.search(r"Answer: The code for the (\w+ \w+) is$", text).group(1)
            value = re.search(rf"The code for the {key} is (\d{{4}})", text).group(1)
            return torch.tensor([tok.encode(f" {value if self.right else '0000'}")[:n]])

    pairs = probe.prompts(tok)
    assert exact_share(Oracle(True), pairs) == 1.0 and exact_share(Oracle(False), pairs) == 0.0
    with pytest.raises(TaskProbeError, match="task@distance"):
        Probe.parse("needle")


def test_answer_loss_is_the_mean_cross_entropy_of_the_answer_tokens_given_the_prompt():
    """Against log-softmax of the full logits, read at the positions that predict each answer token."""
    model = Transformer(tiny_config(vocab_size=264, max_seq_len=512)).double()
    tok, probe = ByteTokenizer(), Probe(Task.NEEDLE, 40, samples=3)
    want, count = 0.0, 0
    for prompt, answer in probe.prompts(tok):
        logp = model(torch.tensor([prompt + answer]))[0].detach().log_softmax(-1)
        want -= sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(answer))
        count += len(answer)
    assert count > 3 and answer_loss(model, probe.prompts(tok)) == pytest.approx(want / count, rel=1e-6)


def test_a_curriculum_run_logs_levels_and_probes_and_resumes_exactly(tmp_path):
    cfg_file = tmp_path / "model.json"
    cfg_file.write_text(tiny_config(vocab_size=264, max_seq_len=512).to_json())
    (tmp_path / "c.json").write_text(
        json.dumps({**NEEDLES, "advance": {"steps": 2}, "probes": ["needle@50"], "probe_every": 3})
    )

    def cfg(out, **kw):
        base = dict(config=str(cfg_file), curriculum=str(tmp_path / "c.json"), out=str(out), steps=6, batch_size=2)
        return TrainConfig(**{**base, "seq_len": 512, "warmup_steps": 1, "progress": False, **kw})

    train(cfg(tmp_path / "straight"))
    rows = [json.loads(x) for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["level"] for r in rows] == [0, 1, 1, 1, 1, 1]  # advanced after 2 steps; 2 levels only
    assert all(0 <= r["accuracy"] <= 1 for r in rows) and "probe/needle@50" in rows[2] and "probe/needle@50" in rows[5]
    assert rows[2]["probe_loss/needle@50"] > 0 and "probe_loss/needle@50" not in rows[3]
    train(cfg(tmp_path / "cut", save_every=3))
    for leftover in ("final", "step_000006", "result.json"):  # as if it had stopped after step 3
        path = tmp_path / "cut" / leftover
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    train(cfg(tmp_path / "cut", resume=True))
    resumed = [json.loads(x) for x in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in rows]  # the same batches, bit for bit
    assert [r["level"] for r in resumed] == [r["level"] for r in rows]


def test_a_run_gates_levels_on_its_advance_probe_and_logs_each_check(tmp_path, monkeypatch):
    import trainer.train as loop

    cfg_file = tmp_path / "model.json"
    cfg_file.write_text(tiny_config(vocab_size=264, max_seq_len=512).to_json())
    (tmp_path / "c.json").write_text(json.dumps({**PROBED, "advance": {**PROBED["advance"], "every": 2}}))
    asked, scores = [], iter([0.0, 0.9, 0.3, 0.7, 1.0])

    def scripted(trainer, probe):  # the score each check would see, and which probe was asked
        asked.append(probe.name)
        return next(scores)

    monkeypatch.setattr(loop.Trainer, "probe_score", scripted)
    cfg = TrainConfig(config=str(cfg_file), curriculum=str(tmp_path / "c.json"), out=str(tmp_path / "run"), steps=9)
    train(TrainConfig(**{**cfg.to_dict(), "batch_size": 2, "seq_len": 512, "warmup_steps": 1, "progress": False}))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    checks = [(r["step"], r["advance_level"], r["advance_score"]) for r in rows if "advance_score" in r]
    assert checks == [(2, 0, 0.0), (4, 0, 0.9), (6, 1, 0.3), (8, 1, 0.7)]  # level 3 is last: no more checks
    assert asked == ["probe/needle@300"] * 4 and [r["level"] for r in rows][-1] == 2


def test_copy_probes_cue_the_repeat_and_ask_for_its_continuation():
    from headprobe.text.probes import COPY_TOKENS

    tok = ByteTokenizer()
    for prompt, answer in Probe.parse("copy@200").prompts(tok):
        text, cont = tok.decode(prompt), tok.decode(answer)
        cue = text.rsplit(" ", 1)[-1]  # the prompt ends with the repeat's first word
        first = text.index(cue + cont)  # the cue and its continuation occurred before: copying answers it
        assert first < len(text) - len(cue) - 200 and len(answer) == COPY_TOKENS and cont.startswith(" ")


def test_a_rare_example_too_long_for_a_row_s_start_gives_way_to_the_next():
    """Repeats of 10-20 symbols are 21-41 bytes: in a row of 32 tokens, those of 16 symbols and more cannot
    open it, and the next example that fits does (the toy recipe's first level, seed 4, met a list of long
    nouns so). Rows without such an example are what they were: the same tokens as drawing in order."""
    raw = {"tasks": {"repeat": 1}, "levels": [{"segment": [10, 20], "row": 32}]}
    source = CurriculumSource(Curriculum.from_dict(raw), ByteTokenizer(), seq_len=128, seed=0)
    mix, eos, passed = source.c.mix(0), ByteTokenizer().eos_id, 0
    for first in range(0, 4096 * 40, 4096):
        tokens, _, n = source._packed(32, first)
        lengths = [len(mix.example(0, first + i).text) for i in range(n)]
        fits = next(i for i, length in enumerate(lengths) if length + 1 <= 32)  # bytes: one token each
        passed += fits
        assert tokens[0] == eos and len(tokens) == 33
        assert tokens[1 : 1 + lengths[fits]].tolist() == list(mix.example(0, first + fits).text.encode())
    assert passed > 0  # some rows did pass over a long first example


def test_an_example_longer_than_a_row_is_refused_with_the_fix():
    far = {"tasks": {"needle": 1}, "levels": [{"distance": [900, 1000]}]}
    source = CurriculumSource(Curriculum.from_dict(far), ByteTokenizer(), seq_len=256, seed=0)
    with pytest.raises(TrainError, match="longer than `seq_len` 256; raise `seq_len`"):
        source.row(0, 0)
    assert CurriculumSource(Curriculum.from_dict(far), ByteTokenizer(), seq_len=2048, seed=0).row(0, 0)[1].any()
