"""load_model for our checkpoints and local Hugging Face models; the TransformerLens peer check."""

from __future__ import annotations

import pytest
import torch

from headprobe.hooked import HeadprobeModel, HFModel, ModelLoadError, load_model
from headprobe.model.checkpoint import save_checkpoint
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.stats import attention_stats
from headprobe.testing import ARCHS, tiny_config


def test_our_checkpoint(tmp_path):
    net = Transformer(tiny_config(vocab_size=264))
    save_checkpoint(net, tmp_path / "ck")
    model = load_model(tmp_path / "ck")
    assert isinstance(model, HeadprobeModel)
    assert [(i.layer_type, i.window, i.n_heads, i.qk_dim) for i in model.layers] == [("sliding", 5, 4, 8)] * 3 + [
        ("full", None, 2, 16)]  # fmt: skip
    ids = torch.randint(0, 256, (1, 20))
    calls, resid = [], {}
    model.run(ids, hook=calls.append, residual=lambda layer, x: resid.__setitem__(layer, x))
    _, cache = model.model.run_with_cache(ids)
    for c in calls:
        torch.testing.assert_close(c.q, cache[f"blocks.{c.layer}.attn.hook_rot_q"].transpose(1, 2))
    torch.testing.assert_close(resid[-1], cache["hook_embed"])
    torch.testing.assert_close(resid[3], cache["blocks.3.hook_resid_post"])
    assert model.decode(ids, 6) == model.model.generate(ids, 6)[0].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_model_matches_eager_and_generate(hf_models, arch):
    from transformers import AutoModelForCausalLM

    model = load_model(hf_models[arch])
    assert isinstance(model, HFModel)
    eager = AutoModelForCausalLM.from_pretrained(str(hf_models[arch]), local_files_only=True,
                                                 attn_implementation="eager").eval()  # fmt: skip
    ids = torch.randint(3, 512, (1, 40))  # longer than the window (8): sliding layers must cut
    with torch.no_grad():
        torch.testing.assert_close(model.hf(input_ids=ids).logits, eager(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
    assert model.decode(ids, 8) == eager.generate(ids, max_new_tokens=8, do_sample=False)[0, 40:].tolist()
    windows = {
        "llama": [None] * 4,
        "mistral": [8] * 4,
        "qwen2": [8, 8, 8, None],
        "qwen3": [8, 8, 8, None],
        "gemma3": [8] * 5 + [None],
    }
    assert [i.window for i in model.layers] == windows[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_entropy_equals_transformerlens_dense_pattern(hf_models, arch):
    """The peer reference: TransformerLens' bridge materialises hook_pattern on the same local model."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(hf_models[arch]), device="cpu")
    ids = torch.randint(3, 512, (1, 40))
    _, cache = bridge.run_with_cache(ids)
    model = load_model(hf_models[arch])
    ours = {}
    model.run(ids, hook=lambda c: ours.__setitem__(c.layer, attention_stats(c.q, c.k, window=c.window,
                                                                            scale=c.scale).entropy))  # fmt: skip
    assert set(ours) == set(range(len(model.layers)))
    for layer, entropy in ours.items():
        p = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        dense = -(torch.where(p > 0, p * p.log(), torch.zeros_like(p))).sum(-1)
        torch.testing.assert_close(entropy.double(), dense, atol=1e-5, rtol=0)


def test_hf_residual_and_key_positions_during_decoding(hf_models):
    model = load_model(hf_models["qwen2"])
    ids = torch.randint(3, 512, (1, 30))
    resid = {}
    model.run(ids, residual=lambda layer, x: resid.__setitem__(layer, x))
    with torch.no_grad():
        hidden = model.hf(input_ids=ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(resid[-1], hidden[0])
    torch.testing.assert_close(resid[2], hidden[3])
    seen = []
    model.decode(
        ids, 3, hook=lambda step, token, call: seen.append((step, call.layer, call.key_start, call.k.shape[2]))
    )
    # every step's query sits at the last key: key_start + k_len == position + 1
    for step, _layer, start, k_len in seen:
        assert start + k_len == 30 + step


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"config\.json is missing"):
        load_model(tmp_path / "empty")
    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ck")
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelLoadError, match="truncated or corrupted"):
        load_model(tmp_path / "ck")


def _batched_steps_equal_single(model, prompts, vocab, steps=5):
    """Left-padded batched steps give every row the logits of its own unpadded decoding (float64)."""
    singles = [model._prefill(p[:, :-1]) for p in prompts]
    batched = model._stack([model._prefill(p[:, :-1]) for p in prompts])
    token = torch.cat([p[:, -1:] for p in prompts])
    for _ in range(steps):
        logits = model._step(batched, token, None)
        for b, state in enumerate(singles):
            alone = model._step(state, token[b : b + 1], None)
            torch.testing.assert_close(logits[b : b + 1], alone, atol=1e-10, rtol=0)
        token = torch.randint(3, vocab, token.shape)


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_batched_decoding_equals_one_at_a_time(hf_models, arch):
    model = load_model(hf_models[arch], dtype=torch.float64)
    prompts = [torch.randint(3, 512, (1, n)) for n in (1, 5, 9, 30)]  # around and past the window (8)
    _batched_steps_equal_single(model, prompts, 512)
    stop = [model.decode(prompts[2], 6)[2]]
    assert model.decode_batch(prompts, 10, stop) == [model.decode(p, 10, stop) for p in prompts]


def test_our_batched_decoding_equals_one_at_a_time():
    torch.manual_seed(0)
    model = HeadprobeModel(Transformer(tiny_config(vocab_size=264)).double(), ByteTokenizer(), "tiny")
    prompts = [torch.randint(0, 256, (1, n)) for n in (1, 4, 6, 23)]  # window 5
    _batched_steps_equal_single(model, prompts, 256)
    stop = [model.decode(prompts[3], 6)[3]]
    assert model.decode_batch(prompts, 10, stop) == [model.decode(p, 10, stop) for p in prompts]


def test_hf_probes_belong_to_their_model(hf_models):
    """The HF route keeps its state per call: a hook on one model sees none of another model's calls,
    even while that model runs inside the hook's context, and none after the context closes."""
    a, b = load_model(hf_models["qwen2"]), load_model(hf_models["llama"])
    ids = torch.randint(3, 512, (1, 12))
    seen = []
    with a.seam.attach(seen.append):
        b.run(ids)
        b.decode(ids, 3)
        assert seen == []
        a.run(ids)
        assert [c.layer for c in seen] == [0, 1, 2, 3]
        assert all(c.key_start == 0 and c.q.shape[2] == 12 for c in seen)
    a.run(ids)
    assert len(seen) == 4  # detached
    steps = []
    a.decode(ids, 2, hook=lambda step, token, call: steps.append((step, call.layer, call.key_start, call.k.shape[2])))
    windows = [i.window for i in a.layers]
    # decoding starts from the last prompt token (position 11), then 12; sliding layers keep their window
    for step, layer, key_start, k_len in steps:
        position = 11 + step
        want = position + 1 if windows[layer] is None else min(position + 1, windows[layer])
        assert k_len == want and key_start == position + 1 - k_len


def test_prompt_start_follows_how_each_model_was_trained(tmp_path, hf_models):
    """Our checkpoints never saw a BOS in training: their prompts start with the text. An HF model's
    start with what its tokenizer file adds by default: the BOS for the Llama-, Mistral- and Gemma-style
    toy tokenizers (as for the real families), nothing for the Qwen-style ones."""
    from headprobe.model.checkpoint import save_checkpoint

    save_checkpoint(Transformer(tiny_config(vocab_size=264)), tmp_path / "ours")
    ours = load_model(tmp_path / "ours")
    assert ours.prompt_start == [] and ours.encode_prompt("Hi") == [72, 105]
    for arch in ARCHS:
        model = load_model(hf_models[arch])
        bos = model.tokenizer.bos_id
        want = [bos] if arch in ("llama", "mistral", "gemma3") else []
        assert model.prompt_start == want, arch
        text_ids = model.tokenizer.encode("the key")
        assert model.encode_prompt("the key") == want + text_ids
        assert model.encode_prompt("<s>the key") == model.tokenizer.encode("<s>the key")  # no second BOS
