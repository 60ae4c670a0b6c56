"""Real models without the real model: GGUF files refused before any work, the conversion cache, the end
tokens a model's files declare, and the prompt format (auto / chat / plain) of needle prompts.

The real SmolLM2 file is exercised in tests/test_real_smollm2.py (marker ``real``)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

import headprobe as hp
from headprobe.cli import app
from headprobe.core.paths import file_sha256
from headprobe.hooked import ModelLoadError
from headprobe.hooked.gguf import SOURCE_FILE, cached_folder
from headprobe.hooked.stops import declared_stop_tokens
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.model.tokenizer import HFTokenizer
from headprobe.testing import build_toy_hf_model, tiny_gguf
from headprobe.text.needles import NEEDLES, needle_prompt
from headprobe.text.prompt_format import chat_turn_end

gguf = pytest.importorskip("gguf", reason="the `gguf` package (pip install 'headprobe[real]') writes the test files")

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory):
    return build_toy_hf_model("llama", tmp_path_factory.mktemp("hf") / "toy", layers=2)


def test_bad_gguf_files_are_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ModelLoadError, match=r"GGUF file .*missing\.gguf does not exist"):
        hp.load_model(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(ModelLoadError, match=r"is not a GGUF file \(it does not start with 'GGUF'\)"):
        hp.load_model(tmp_path / "text.gguf")
    tiny_gguf(tmp_path / "whole.gguf")
    data = (tmp_path / "whole.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:40])  # the header promises metadata that is not there
    with pytest.raises(ModelLoadError, match=r"cut\.gguf is not a readable GGUF file .*is it complete\?"):
        hp.load_model(tmp_path / "cut.gguf")
    tiny_gguf(tmp_path / "odd.gguf", arch="clip")
    with pytest.raises(ModelLoadError, match=r"GGUF architecture 'clip' is not one transformers .* can read"):
        hp.load_model(tmp_path / "odd.gguf")
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


def test_a_missing_gguf_package_is_named_with_the_install_command(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("No module named 'gguf'")
        return real_import(name, *args, **kwargs)

    tiny_gguf(tmp_path / "m.gguf")
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(builtins, "__import__", no_gguf)
    with pytest.raises(ModelLoadError, match=r"needs the `gguf` package; pip install 'headprobe\[real\]'"):
        hp.load_model(tmp_path / "m.gguf")


def test_a_converted_file_is_read_from_the_cache_by_content(tmp_path, monkeypatch, toy_folder):
    """The cache is keyed by the file's SHA-256: a file whose conversion is there loads from it, under the
    file's own name, without converting; a file with other bytes is another entry."""
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    tiny_gguf(tmp_path / "My-Model.Q4.gguf")
    import hashlib

    sha = hashlib.sha256((tmp_path / "My-Model.Q4.gguf").read_bytes()).hexdigest()
    assert file_sha256(tmp_path / "My-Model.Q4.gguf") == sha
    folder = cached_folder(sha)
    assert folder == tmp_path / "cache" / "gguf" / sha
    shutil.copytree(toy_folder, folder)
    files = {f.name: f.stat().st_size for f in folder.iterdir()}  # what a conversion records, to be checked
    (folder / SOURCE_FILE).write_text(json.dumps({"file": "My-Model.Q4.gguf", "sha256": sha, "files": files}))
    import headprobe.hooked.gguf as gguf_mod

    monkeypatch.setattr(gguf_mod, "_convert", lambda *a: pytest.fail("converted although cached"))
    model = hp.load_model(tmp_path / "My-Model.Q4.gguf")
    assert model.name == "My-Model.Q4" == checkpoint_name(tmp_path / "My-Model.Q4.gguf")
    assert model.folder == folder and model.source == {"file": "My-Model.Q4.gguf", "sha256": sha, "files": files}
    assert model.facts()["source"]["sha256"] == sha
    # a length beyond the file's own context is refused from the header, before any conversion
    tiny_gguf(tmp_path / "other.gguf", context=512)
    with pytest.raises(hp.hooked.BeyondTrainedError, match=r"1,024 tokens exceed the 512 positions"):
        hp.hooked.check_trained_lengths(tmp_path / "other.gguf", [1024])


def test_a_half_written_cache_entry_is_not_taken_for_a_conversion(tmp_path, monkeypatch, toy_folder):
    """A conversion that dies midway leaves no folder holding source.json, so the next run converts again."""
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    tiny_gguf(tmp_path / "m.gguf")
    import headprobe.hooked.gguf as gguf_mod

    def dies(path, out):
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_mod, "_convert", dies)
    with pytest.raises(KeyboardInterrupt):
        hp.load_model(tmp_path / "m.gguf")
    entries = list((tmp_path / "cache" / "gguf").iterdir())
    assert all(e.name.startswith(".") for e in entries)  # only the lock file: no folder under the hash

    def converts(path, out):
        for f in toy_folder.iterdir():
            shutil.copy(f, out / f.name)

    monkeypatch.setattr(gguf_mod, "_convert", converts)
    logged = []
    model = hp.load_model(tmp_path / "m.gguf", log=logged.append)
    assert model.name == "m" and len(logged) == 1 and "converting m.gguf (llama) once into" in logged[0]
    source = json.loads((model.folder / SOURCE_FILE).read_text())
    assert source["sha256"] == file_sha256(tmp_path / "m.gguf") and source["context_length"] == 2048


def test_analyze_names_a_bad_gguf_file_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADPROBE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(64))
    res = CliRunner().invoke(
        app, ["analyze", str(tmp_path / "x.gguf"), "--metrics", "entropy", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code != 0 and "is not a GGUF file" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_every_declared_end_token_stops_decoding(tmp_path, toy_folder):
    """The files disagree on purpose, as SmolLM2's do: each id keeps the files that declare it."""
    folder = tmp_path / "m"
    shutil.copytree(toy_folder, folder)
    tok = HFTokenizer(folder)
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    names = {a["content"]: a["id"] for a in added}
    assert {"<s>", "</s>"} <= names.keys()
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = [names["</s>"], 10**9]  # an id outside the vocabulary is ignored
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tc["eos_token"] = {"content": "<s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tc))
    stops = declared_stop_tokens(folder, tok)
    assert stops == {
        7: ("generation_config.json",),
        names["<s>"]: ("tokenizer_config.json",),
        names["</s>"]: ("config.json", "tokenizer.json"),
    }
    model = hp.load_model(folder)
    assert model.stop_ids == sorted(stops)
    assert model.facts()["stop_tokens"]["</s>"] == ["config.json", "tokenizer.json"]


@pytest.fixture(scope="module")
def chat_folder(toy_folder, tmp_path_factory):
    """The toy llama folder with a ChatML template and its two special tokens."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("chat") / "chat"
    shutil.copytree(toy_folder, folder)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(folder))
    return folder


def test_the_chat_template_end_of_turn_is_a_stop_token(chat_folder, toy_folder):
    folder = chat_folder
    assert chat_turn_end(folder) == "<|im_end|>\n"
    hf_tok = HFTokenizer(folder)
    end = hf_tok.token_id("<|im_end|>")
    assert end is not None and "chat template" in declared_stop_tokens(folder, hf_tok)[end]
    assert chat_turn_end(toy_folder) is None  # no template: no end of turn


def test_needle_prompts_take_the_model_s_chat_template_under_auto(chat_folder, toy_folder):
    chat_model, plain_model = hp.load_model(chat_folder), hp.load_model(toy_folder)
    auto = needle_prompt(
        chat_model.tokenizer,
        NEEDLES[0],
        400,
        50,
        start=chat_model.prompt_start,
        wrapper=chat_model.prompt_wrapper("auto"),
    )
    assert auto.prompt_format == "chat"
    assert auto.text.startswith("<|im_start|>user\n ") and auto.text.endswith("?<|im_end|>\n<|im_start|>assistant\n")
    plain = needle_prompt(
        chat_model.tokenizer,
        NEEDLES[0],
        400,
        50,
        start=chat_model.prompt_start,
        wrapper=chat_model.prompt_wrapper("plain"),
    )
    assert plain.prompt_format == "plain" and plain.text.endswith("?\nAnswer:") and "<|im_start|>" not in plain.text
    assert plain_model.prompt_wrapper("auto").format == "plain"  # no template: auto is plain
    with pytest.raises(ValueError, match=r"has no chat template.*use `prompt_format` plain"):
        plain_model.prompt_wrapper("chat")
    for p in (auto, plain):  # the answer span is the answer's own tokens, whatever the wrapper
        assert NEEDLES[0].answer in chat_model.tokenizer.decode(p.ids[p.answer_start : p.answer_end])
        assert len(p.ids) in (399, 400)


def test_why_few_needles_were_kept_is_said_with_what_to_try():
    from headprobe.metrics.retrieval import diagnose

    samples = pd.DataFrame(
        {
            "response": ["", "  ", "7798969. Answer: 7798969. Answer:", "the lighthouse"],
            "kept": [False, False, False, True],
            "stop": ["\n", "<|im_end|>", "", "<|im_end|>"],
            "prompt_format": ["plain"] * 4,
        }
    )
    said = diagnose(samples, "builtin", chat_template=True)
    assert said.startswith("2 answered nothing (an empty line or an end token first); 1 answered without the needle")
    assert "1 ran to the decoding budget without an end token" in said
    assert "`--prompt-format chat` (the model has a chat template)" in said and "--needles codes" not in said
    toy = diagnose(samples.assign(prompt_format="plain"), "builtin", chat_template=False)
    assert "`--needles codes` if this is one of headprobe's toy models" in toy and "--prompt-format" not in toy
    chat = diagnose(samples.assign(prompt_format="chat"), "codes", chat_template=True)
    assert "--prompt-format" not in chat and "`--needles builtin`" in chat


def test_analyze_of_a_hugging_face_folder_prints_no_transformers_bar_and_says_why_none_was_kept(tmp_path, toy_folder):
    """A random-weight model keeps no needle: the run says why and what to try, and transformers' own
    "Loading weights" bar stays out of headprobe's output."""
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["analyze", str(toy_folder), "--metrics", "retrieval", "--lengths", "256", "--samples", "2",
              "--max-new-tokens", "4", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Loading weights" not in res.output and "it/s]" not in res.output
    assert "retrieval L=256: 0 of 2 kept:" in res.output and "try " in res.output
    assert "`--needles codes` if this is one of headprobe's toy models" in res.output  # the toy has no chat template
