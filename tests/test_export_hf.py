"""``headprobe export hf``: the exported folder in transformers against our own model.

References: our ``Transformer`` (itself held to a dense float64 implementation in tests/test_model.py) and
our ``ByteTokenizer`` / ``tokenizer.json``; transformers loads the folder with its own machinery
(``AutoModelForCausalLM``, ``AutoTokenizer``, ``generate`` with its cache), through the code written into
the folder, in a process that cannot import headprobe where that matters.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from headprobe.cli import app
from headprobe.export.hf import CODE_FILES, MODEL_TYPE, export_hf
from headprobe.model.checkpoint import load_checkpoint, save_checkpoint
from headprobe.model.config import AttentionConfig
from headprobe.model.presets import list_presets, preset
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import build_toy_bpe, tiny_config

transformers = pytest.importorskip("transformers")
runner = CliRunner()

# every toy preset, and the 0.6B grid's asymmetric members at reduced depth (4 layers: three sliding with
# the 0.6B window of 512, one full) and vocabulary (512 ids), at lengths past the sliding window
SHAPES = {
    **{name: (preset(name), 48) for name in list_presets("toy")},
    **{name: (preset(name, n_layers=4, vocab_size=512), 600) for name in ("0.6b-k512v128", "0.6b-k128v512")},
    # grouped-query sliding layers, qk 16 != v 4 full heads, partial RoPE (8 of 16), window 5
    "tiny-gqa": (tiny_config(vocab_size=264), 40),
    # no RoPE in the full layers, an untied LM head, every layer full except one
    "tiny-untied": (
        tiny_config(
            vocab_size=300, tie_embeddings=False, full_every=2,
            full=AttentionConfig(n_heads=4, qk_head_dim=12, v_head_dim=20, n_kv_heads=1, rope_dim=0),
        ),
        30,
    ),
    # QK-norm in both layer types (the gains drawn away from 1: a missing or misnamed gain shows)
    "tiny-qknorm": (
        tiny_config(
            vocab_size=264,
            swa=AttentionConfig(
                n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=2, rope_dim=8, window=5, qk_norm=True
            ),
            full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, qk_norm=True),
        ),
        40,
    ),
    # QK-norm with a width-independent scale in the full layers (softmax scale qk_norm_scale / qk_head_dim)
    "tiny-qknorm-scale": (
        tiny_config(
            vocab_size=264,
            full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, qk_norm=True, qk_norm_scale=6.0),
        ),
        40,
    ),
}  # fmt: skip


def exported(tmp_path_factory, name: str) -> tuple[Transformer, Path]:
    cfg, _ = SHAPES[name]
    root = tmp_path_factory.mktemp(name)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for param in (p for n, p in model.named_parameters() if n.endswith("_norm.weight")):
            param.uniform_(0.5, 2.0)
    save_checkpoint(model, root / "ckpt")
    return model, export_hf(root / "ckpt", root / "hf")


def hf_model(folder: Path, impl: str, dtype: torch.dtype = torch.float32):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, trust_remote_code=True, attn_implementation=impl, dtype=dtype
    ).eval()


@pytest.mark.parametrize("name", list(SHAPES))
def test_exported_logits_equal_ours_within_1e_5_in_float32_and_1e_10_in_float64(tmp_path_factory, name):
    model, folder = exported(tmp_path_factory, name)
    _, length = SHAPES[name]
    torch.manual_seed(1)
    ids = torch.randint(0, min(model.cfg.vocab_size, 264), (1 if name.startswith("0.6b") else 2, length))
    with torch.no_grad():
        ours = model(ids)
        for impl in ("eager", "sdpa"):
            theirs = hf_model(folder, impl)
            assert type(theirs).__name__ == "HeadShapeForCausalLM" and theirs.config.model_type == MODEL_TYPE
            assert theirs.config._attn_implementation == impl
            diff = (theirs(ids).logits - ours).abs().max().item()
            assert diff < 1e-5, (name, impl, diff)
        if name.startswith("0.6b"):  # float64 at 0.6B width costs 10 s; the small shapes hold the exactness
            return
        ours64, theirs64 = model.double()(ids), hf_model(folder, "eager", torch.float64)(ids).logits
        assert (theirs64 - ours64).abs().max().item() < 1e-10


@pytest.mark.parametrize("name", ["tiny-gqa", "toy-k64v16", "tiny-untied", "tiny-qknorm"])
def test_greedy_generation_with_the_transformers_cache_equals_ours(tmp_path_factory, name):
    """Past the sliding window (transformers keeps a sliding layer's cache at its window), one prompt and
    a left-padded batch of two prompts of different lengths."""
    model, folder = exported(tmp_path_factory, name)
    theirs = hf_model(folder, "sdpa")
    eos = ByteTokenizer.eos_id
    torch.manual_seed(2)
    short, long = torch.randint(0, 256, (1, 9)), torch.randint(0, 256, (1, 23))
    with torch.no_grad():
        ours = model.generate(long, 30, stop_ids=[eos])[0].tolist()
        hf = theirs.generate(long, max_new_tokens=30, do_sample=False)[0, long.shape[1] :].tolist()
        assert hf == ours and len(hf) > 2 * model.cfg.swa.window
        ours_batch = model.generate([short, long], 30, stop_ids=[eos])
        padded = torch.cat([torch.full((1, 14), ByteTokenizer.pad_id), short], dim=1)
        batch = torch.cat([padded, long])
        mask = torch.cat([torch.cat([torch.zeros(1, 14), torch.ones(1, 9)], 1), torch.ones(1, 23)]).long()
        hf_batch = theirs.generate(batch, attention_mask=mask, max_new_tokens=30, do_sample=False)[:, 23:]
    for row in range(2):  # ours pads a finished row with its stop token, transformers with the pad id
        mine, theirs_row = ours_batch[row].tolist(), hf_batch[row].tolist()
        end = mine.index(eos) + 1 if eos in mine else len(mine)
        assert theirs_row[:end] == mine[:end], row


def test_the_exported_code_imports_no_headprobe_and_loads_in_a_process_without_it(tmp_path_factory, tmp_path):
    model, folder = exported(tmp_path_factory, "tiny-gqa")
    for name in CODE_FILES:
        tree = ast.parse((folder / name).read_text())
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):  # a relative import stays inside the folder: "."
                roots.add("." if node.level else node.module.split(".")[0])
            elif isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
        assert roots <= {"__future__", "collections", "typing", "torch", "transformers", "."}, (name, roots)
    ids = torch.arange(40)[None] * 5 % 256
    with torch.no_grad():
        expected = model(ids)
    torch.save({"ids": ids, "logits": expected}, tmp_path / "ref.pt")
    script = f"""
import sys
sys.modules["headprobe"] = None  # any import of headprobe fails
import torch
from transformers import AutoModelForCausalLM
ref = torch.load({str(tmp_path / "ref.pt")!r})
m = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
with torch.no_grad():
    print((m(ref["ids"]).logits - ref["logits"]).abs().max().item())
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) < 1e-5


@pytest.mark.parametrize("order", ["headprobe first", "transformers first"])
def test_with_headprobe_imported_the_folder_loads_without_remote_code(tmp_path_factory, order):
    _, folder = exported(tmp_path_factory, "tiny-gqa")
    imports = ["import headprobe", "from transformers import AutoConfig, AutoModel, AutoModelForCausalLM"]
    load = (
        f"m = AutoModelForCausalLM.from_pretrained({str(folder)!r})\n"
        f"base = AutoModel.from_pretrained({str(folder)!r})\n"
        f"print(type(m).__module__, type(m).__name__, type(base).__name__, "
        f"AutoConfig.from_pretrained({str(folder)!r}).model_type)\n"
    )
    script = "\n".join(imports if order == "headprobe first" else imports[::-1]) + "\n" + load
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    module = "headprobe.export.hf_code.modeling_headshape"
    assert done.stdout.split() == [module, "HeadShapeForCausalLM", "HeadShapeModel", MODEL_TYPE]


def test_the_registration_costs_a_process_that_loads_no_export_nothing():
    """Our own model imports transformers' Auto modules (through TransformerLens); the registration must not
    pull in transformers' model code (1-2 s) there: it waits until a model class is used."""
    script = "import sys, headprobe, headprobe.model.transformer; print('transformers.modeling_utils' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr[-2000:]


def test_without_headprobe_transformers_asks_for_remote_code(tmp_path_factory):
    """The registration is headprobe's doing: a process that never imports it must opt into the code."""
    _, folder = exported(tmp_path_factory, "tiny-gqa")
    script = f"from transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained({str(folder)!r})"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0 and "trust_remote_code" in done.stderr


def test_a_bfloat16_checkpoint_exports_and_loads_back_in_bfloat16(tmp_path):
    import headprobe as hp

    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=264)).to(torch.bfloat16)
    folder = export_hf(save_checkpoint(model, tmp_path / "ckpt"), tmp_path / "hf")
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    assert transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).dtype == torch.bfloat16
    back = hp.load_model(folder).model
    assert back.embed.weight.dtype == torch.bfloat16 and torch.equal(back.embed.weight, model.embed.weight)


def test_load_model_reads_the_export_back_as_our_model_exactly(tmp_path_factory):
    import headprobe as hp

    model, folder = exported(tmp_path_factory, "tiny-untied")
    back = hp.load_model(folder)
    assert type(back).__name__ == "HeadprobeModel" and back.model.cfg == model.cfg
    for (name, a), (_, b) in zip(model.state_dict().items(), back.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert isinstance(back.tokenizer, ByteTokenizer)


def test_config_and_files_follow_transformers_conventions(tmp_path_factory):
    _, folder = exported(tmp_path_factory, "toy-k64v16")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE and config["architectures"] == ["HeadShapeForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "configuration_headshape.HeadShapeConfig",
        "AutoModel": "modeling_headshape.HeadShapeModel",
        "AutoModelForCausalLM": "modeling_headshape.HeadShapeForCausalLM",
    }
    # toy-k64v16: 4 layers alternating sliding (4 heads of 32, window 8) and full (2 heads, qk 64, v 16)
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 2 and config["sliding_window"] == 8
    assert config["attention"]["full_attention"] == {"num_attention_heads": 2, "num_key_value_heads": 2,
        "qk_head_dim": 64, "v_head_dim": 16, "rope_dim": 8, "rope_theta": 10000.0, "qk_norm": False}  # fmt: skip
    assert config["attention"]["sliding_attention"]["qk_head_dim"] == 32 and config["tie_word_embeddings"] is True
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258, "do_sample": False}
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "lm_head.weight" not in names and "model.layers.1.self_attn.q_proj.weight" in names
    assert len(names) == 2 + 4 * 9  # embedding, final norm; per layer 2 norms, q k v o, gate up down
    assert (folder / "modeling_headshape.py").read_bytes() == (
        Path(__file__).parents[1] / "headprobe/export/hf_code/modeling_headshape.py"
    ).read_bytes()


def test_the_byte_tokenizer_exports_as_a_tokenizer_json_with_the_same_ids(tmp_path_factory):
    _, folder = exported(tmp_path_factory, "tiny-gqa")
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    byte = ByteTokenizer()
    texts = ["", "plain ascii, with  two spaces\nand a newline", "héllo wörld — ∑ 日本語 🙂", "\x00\x7f\xff tab\t"]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == byte.encode(text), text
        assert tok.decode(ids) == byte.decode(ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258) and len(tok) == 264


def test_a_bpe_checkpoint_exports_its_own_tokenizer_json(tmp_path):
    tok_file = build_toy_bpe(tmp_path / "tok.json", special_tokens=("<|endoftext|>", "<pad>"))
    tokenizer = HFTokenizer(tok_file)
    torch.manual_seed(0)
    save_checkpoint(Transformer(tiny_config(vocab_size=tokenizer.vocab_size)), tmp_path / "ckpt", tokenizer)
    folder = export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert (folder / "tokenizer.json").read_bytes() == (tmp_path / "ckpt" / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the cat sat on the mat; 42 dogs."
    assert tok(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text)
    assert (tok.eos_token, tok.pad_token) == ("<|endoftext|>", "<pad>")
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == tokenizer.eos_id


def test_bad_inputs_are_refused_before_any_work(tmp_path):
    torch.manual_seed(0)
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ckpt")

    def export(*args: str):
        return runner.invoke(app, ["export", "hf", *map(str, args)], env={"COLUMNS": "300"})

    step = tmp_path / "step_000100"  # a trainer step folder
    (step / "dcp").mkdir(parents=True)
    (step / "state.json").write_text("{}")
    res = export(step, tmp_path / "a")
    assert res.exit_code == 2 and f"headprobe train export {step} CKPT" in res.output and not (tmp_path / "a").exists()
    res = export(tmp_path / "missing", tmp_path / "a")
    assert res.exit_code == 2 and "missing does not exist; give a headprobe checkpoint folder" in res.output
    (tmp_path / "empty").mkdir()
    res = export(tmp_path / "empty", tmp_path / "a")
    assert res.exit_code == 2 and "config.json is missing" in res.output
    assert export(tmp_path / "ckpt", tmp_path / "out").exit_code == 0
    before = (tmp_path / "out" / "model.safetensors").read_bytes()
    res = export(tmp_path / "ckpt", tmp_path / "out")
    assert res.exit_code == 2
    assert "exists (a Hugging Face export of a headprobe checkpoint); give another OUT, or add --overwrite" in (
        res.output
    )
    assert export(tmp_path / "ckpt", tmp_path / "out", "--overwrite").exit_code == 0
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == before
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    res = export(tmp_path / "broken", tmp_path / "a")
    assert res.exit_code == 2 and "broken/config.json is not valid JSON" in res.output and "Traceback" not in res.output
    res = export(tmp_path / "out", tmp_path / "again")  # an export is not one of our checkpoints
    assert res.exit_code == 2 and "already a Hugging Face model folder" in res.output
    tok_file = build_toy_bpe(tmp_path / "tok.json")
    torch.manual_seed(0)
    bpe = save_checkpoint(Transformer(tiny_config(vocab_size=300)), tmp_path / "bpe", HFTokenizer(tok_file))
    (bpe / "tokenizer.json").unlink()
    res = export(bpe, tmp_path / "b")
    assert res.exit_code == 2 and "tokenizer.json is missing" in res.output and not (tmp_path / "b").exists()
    model, _ = load_checkpoint(tmp_path / "ckpt")  # the checkpoint itself is untouched
    assert model.cfg == tiny_config(vocab_size=264)


def test_lm_eval_stock_hf_model_on_the_export_gives_shortctx_evals_loglikelihoods(tmp_path_factory, tmp_path):
    """``lm_eval --model hf`` (its own loading, tokenisation and scoring) on a local multiple-choice task, and
    ``headprobe shortctx eval`` of the checkpoint the folder was exported from, on the same items."""
    pytest.importorskip("lm_eval")
    _, folder = exported(tmp_path_factory, "tiny-gqa")
    checkpoint = folder.parent / "ckpt"
    items = [
        {"context": "The capital of France is", "choices": [" Paris", " Rome", " a small dog"], "label": 0},
        {"context": "2 + 2 =", "choices": [" 4", " five"], "label": 0},
        {"context": "Water freezes at", "choices": [" 0 degrees", " 100 degrees", " noon"], "label": 2},
        {"context": "Cats say", "choices": [" meow", " moo"], "label": 1},
        {"context": "Ünïcödé text →", "choices": [" ✓ yes", " no"], "label": 0},
    ]
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in items))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "hp_local.yaml").write_text(
        "task: hp_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\noutput_type: multiple_choice\n"
        'doc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\n'
        'target_delimiter: ""\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n'
    )  # headprobe's jsonl scores each choice as written: no delimiter added before it
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    command = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
               f"pretrained={folder},trust_remote_code=True,dtype=float32", "--tasks", "hp_local", "--include_path",
               str(tmp_path / "tasks"), "--output_path", str(tmp_path / "lm"), "--log_samples", "--device", "cpu",
               "--batch_size", "2"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = [json.loads(line) for line in next((tmp_path / "lm").rglob("samples_hp_local_*.jsonl")).open()]
    theirs = {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in samples}
    res = runner.invoke(app, ["shortctx", "eval", str(checkpoint), "--task", "jsonl", "--file", str(data),
                              "--out", str(tmp_path / "hp"), "--no-progress"])  # fmt: skip
    assert res.exit_code == 0, res.output
    ours = pd.read_parquet(tmp_path / "hp" / "ckpt" / "shortctx_items.parquet").sort_values("item")
    assert sorted(theirs) == list(range(len(items))) == ours["item"].tolist()
    for row in ours.itertuples():
        assert len(theirs[row.item]) == len(items[row.item]["choices"])
        assert max(abs(a - b) for a, b in zip(theirs[row.item], row.loglikelihoods, strict=True)) < 1e-4, row.item
    results = json.loads(next((tmp_path / "lm").rglob("results_*.json")).read_text())["results"]["hp_local"]
    scores = pd.read_parquet(tmp_path / "hp" / "ckpt" / "shortctx_scores.parquet").set_index("metric")["value"]
    assert results["acc,none"] == pytest.approx(scores["acc"]) and results["acc_norm,none"] == pytest.approx(
        scores["acc_norm"]
    )


def test_the_vllm_plugin_refuses_exactly_the_members_vllms_attention_cannot_run():
    """vLLM builds one attention shape for every layer, with one head size for keys and values: of the study's
    grids only the members whose sliding and full layers share one symmetric shape can run."""
    from headprobe.export.hf import hf_config
    from headprobe.export.vllm import vllm_refusal

    runnable = {name for name in list_presets() if vllm_refusal(hf_config(preset(name), ByteTokenizer())) is None}
    assert runnable == {"toy-d32", "0.6b-d128", "3b-d128"}  # 4 x 32 and 16 x 128 in both layer types
    refusal = vllm_refusal(hf_config(preset("toy-k64v16"), ByteTokenizer()))
    assert "different attention shapes" in refusal and "'qk_head_dim': 64" in refusal
    same = tiny_config(
        full_every=1, full=AttentionConfig(n_heads=4, qk_head_dim=16, v_head_dim=8, n_kv_heads=2, rope_dim=8)
    )  # every layer full: one shape, but values narrower than queries and keys
    assert "one head size for keys and values" in vllm_refusal(hf_config(same, ByteTokenizer()))


def test_the_vllm_plugin_registers_its_class_lazily_and_the_class_refuses_before_building(monkeypatch):
    """Without vLLM here: stand-ins for vLLM's registry and Transformers backend record what the plugin
    registers and what its class hands on (vLLM imports the class by its string only when it builds a model)."""
    import importlib.metadata
    import types

    from headprobe.export import vllm as plugin
    from headprobe.export.hf import hf_config
    from headprobe.export.hf_code.configuration_headshape import HeadShapeConfig

    calls, built = [], []
    registry = types.SimpleNamespace(get_supported_archs=lambda: set(), register_model=lambda *a: calls.append(a))

    class Backend:  # vLLM's TransformersForCausalLM
        def __init__(self, *, vllm_config, prefix=""):
            built.append(vllm_config.model_config.model)

    backend = types.ModuleType("vllm.model_executor.models.transformers")
    backend.TransformersForCausalLM = Backend
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(ModelRegistry=registry))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models.transformers", backend)
    monkeypatch.delitem(vars(plugin), "HeadShapeForCausalLM", raising=False)
    plugin.register()
    assert calls == [("HeadShapeForCausalLM", "headprobe.export.vllm:HeadShapeForCausalLM")]
    module, name = calls[0][1].split(":")
    cls = getattr(importlib.import_module(module), name)  # as vLLM resolves the string
    assert issubclass(cls, Backend) and f"{cls.__module__}.{cls.__qualname__}" == calls[0][1].replace(":", ".")

    def vllm_config(member: str):
        config = HeadShapeConfig(**hf_config(preset(member), ByteTokenizer()))
        return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_config=config, model=f"hf/{member}"))

    cls(vllm_config=vllm_config("toy-d32"))
    with pytest.raises(ValueError, match="vLLM cannot run hf/toy-k64v16: its layer types have different"):
        cls(vllm_config=vllm_config("toy-k64v16"))
    assert built == ["hf/toy-d32"]
    monkeypatch.delitem(vars(plugin), "HeadShapeForCausalLM")
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert found.get("headprobe") == "headprobe.export.vllm:register"  # what vLLM's plugin loader reads
