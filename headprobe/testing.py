"""Small models and tokenizers built offline, for tests, benchmarks and trying headprobe without any download.

* :func:`tiny_config`: a 4-layer model small enough for float64 reference implementations.
* :func:`random_grid`: a trained grid's layout (``RUNS/<member>/s<seed>/<run>/final`` and ``manifest.json``)
  of random tiny byte models, what the study's measurements and the ``analyses/`` scripts read.
* :func:`build_toy_bpe`: a byte-level BPE ``tokenizer.json`` trained locally.
* :func:`build_toy_hf_model`: a Hugging Face model with random weights and a local tokenizer::

      path = build_toy_hf_model("llama", "toy-llama")
      model = headprobe.load_model(path)

  Architectures: ``llama`` (full attention), ``mistral`` (every layer sliding), ``qwen2`` and ``qwen3``
  (sliding and full layers by ``layer_types``; qwen3 with query/key norms), ``gemma3`` (5:1
  sliding:full, query/key norms, its own scale). As in the real families, the llama, mistral and gemma3
  tokenizers put a BOS before every text by default; the qwen ones do not.
* :func:`tiny_gguf`: a small, valid GGUF file (header, metadata, one tensor), for the checks made before a
  GGUF file is converted (it holds no model transformers could convert).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from headprobe.model.config import AttentionConfig, ModelConfig

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
_ADDS_BOS = {"llama", "mistral", "gemma3"}


def tiny_config(**overrides: Any) -> ModelConfig:
    """A 4-layer model (layer 3 full attention, grouped-query sliding layers with window 5, full heads
    with qk 16 != v 4) small enough for float64 reference implementations."""
    base: dict[str, Any] = dict(
        vocab_size=40,
        d_model=32,
        n_layers=4,
        d_ff=48,
        swa=AttentionConfig(n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=2, rope_dim=8, window=5),
        full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, rope_theta=500.0),
        max_seq_len=4096,  # "trained" length: analyses and evaluations refuse longer inputs without asking
        init_std=0.2,
    )
    base.update(overrides)
    return ModelConfig(**base)


def tiny_checkpoint(path: str | Path, *, seed: int = 0, tokenizer: Any = None, **overrides: Any) -> Path:
    """Save a random-weight :func:`tiny_config` model (``overrides`` of its config; weights drawn with
    ``seed``) and ``tokenizer`` (``None``: the byte tokenizer) as a checkpoint folder ``path``; returns it."""
    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.transformer import Transformer

    torch.manual_seed(seed)
    return save_checkpoint(Transformer(tiny_config(**overrides)), path, tokenizer)


GRID_RUNS = (("pt", "pt", None), ("cpt", "cpt", None), ("cpt-frozen", "cpt", "attention"))


def random_grid(runs: str | Path, members: Iterable[str] = ("toy-a",), seeds: Iterable[int] = (0, 1)) -> dict[str, Any]:
    """Random tiny byte models (``tiny_config``, 1,024 positions) in a trained grid's layout, each run of
    :data:`GRID_RUNS` per member and seed, and the grid's manifest (also written to ``RUNS/manifest.json``);
    models already there are kept. A stand-in for the trainer wherever only the layout matters."""
    import json

    from headprobe.model.checkpoint import save_checkpoint
    from headprobe.model.tokenizer import ByteTokenizer
    from headprobe.model.transformer import Transformer

    runs, entries = Path(runs), []
    for s, seed in enumerate(seeds):
        for m, member in enumerate(members):
            for i, (run, stage, freeze) in enumerate(GRID_RUNS):
                folder = runs / member / f"s{seed}" / run / "final"
                if not folder.is_dir():
                    torch.manual_seed(100 * s + 10 * m + i)
                    save_checkpoint(Transformer(tiny_config(vocab_size=264, max_seq_len=1024)), folder, ByteTokenizer())
                entries.append(
                    dict(member=member, seed=seed, run=run, stage=stage, freeze=freeze, checkpoint=str(folder))
                    | dict(tokens=10, steps=1, final_loss=1.0 + s + m, status="trained", status_reason=None)
                    | dict(eval_loss=2.0 + s + m, eval_loss_local=1.5 + s + m, eval_loss_retrieval=3.0 + s + m)
                )
    manifest = {"recipe": None, "scale": "toy", "profile": None, "runs": entries}
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def train_bpe(vocab_size: int, special_tokens: list[str], texts: Iterable[str] | None = None, bos: str | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (default: 200 documents of the built-in
    corpus); with ``bos``, its post-processor puts that token before every text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from headprobe.text.corpus import document

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts if texts is not None else (document(0, i)[1] for i in range(200)), trainer)
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
        )
    return tok


def build_toy_bpe(
    path: str | Path,
    vocab_size: int = 300,
    special_tokens: tuple[str, ...] = ("<|endoftext|>", "<pad>"),
    texts: Iterable[str] | None = None,
) -> Path:
    """Write a byte-level BPE ``tokenizer.json`` to ``path`` (a file, or a folder to put it in); returns the file."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    train_bpe(vocab_size, list(special_tokens), texts).save(str(path))
    return path


def _hf_tokenizer(vocab_size: int, adds_bos: bool):
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe(vocab_size, ["<s>", "</s>", "<pad>"], bos="<s>" if adds_bos else None)
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
    _hf_tokenizer(vocab_size, arch in _ADDS_BOS).save_pretrained(str(folder))
    return folder


def tiny_gguf(path: str | Path, arch: str = "llama", context: int = 2048) -> Path:
    """Write a small, valid GGUF file of architecture ``arch`` (its header, a context length, a name and one
    tensor) to ``path`` with the ``gguf`` package; returns the path."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_name("tiny")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
