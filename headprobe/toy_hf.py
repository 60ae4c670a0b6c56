"""Small Hugging Face models with random weights and a locally trained tokenizer, built offline.

For tests, benchmarks and trying the Hugging Face route without any download::

    path = build_toy_hf_model("llama", "toy-llama")
    model = headprobe.load_model(path)

Architectures: ``llama`` (full attention), ``mistral`` (every layer sliding), ``qwen2`` and ``qwen3``
(sliding and full layers by ``layer_types``; qwen3 with query/key norms), ``gemma3`` (5:1
sliding:full, query/key norms, its own scale).
"""

from __future__ import annotations

from pathlib import Path

import torch

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from headprobe.text.corpus import document

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((document(0, i)[1] for i in range(200)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def build_toy_hf_model(
    arch: str,
    folder: str | Path,
    *,
    hidden_size: int = 64,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    window: int = 8,
    vocab_size: int = 512,
    max_positions: int = 262_144,
    seed: int = 0,
) -> Path:
    """Write a random-weight ``arch`` model and its tokenizer to ``folder``; returns the folder."""
    import transformers as tf

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {ARCHS}")
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif arch == "mistral":
        cfg, cls = tf.MistralConfig(**common, sliding_window=window), tf.MistralForCausalLM
    elif arch in ("qwen2", "qwen3"):
        types = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
        config_cls, cls = (
            (tf.Qwen2Config, tf.Qwen2ForCausalLM) if arch == "qwen2" else (tf.Qwen3Config, tf.Qwen3ForCausalLM)
        )
        cfg = config_cls(**common, use_sliding_window=True, sliding_window=window, layer_types=types)
    else:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
        cfg = tf.Gemma3TextConfig(**common, sliding_window=window, layer_types=types, query_pre_attn_scalar=head_dim)
        cls = tf.Gemma3ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg)
    folder = Path(folder)
    model.save_pretrained(str(folder))
    _tokenizer(vocab_size).save_pretrained(str(folder))
    return folder
