"""Models the analysis can read: our checkpoints and Hugging Face causal LMs from a local folder.

``load_model(path)`` returns a :class:`ProbedModel`, one interface over both:

* ``tokenizer`` (``encode``/``decode``/special ids), ``layers`` (a :class:`LayerInfo` per layer:
  type, head counts, window, scale), ``max_positions`` and ``device``;
* ``run(input_ids, probe=..., residual=...)``: a forward pass that hands every attention layer's
  post-RoPE queries and keys to ``probe`` as a :class:`headprobe.model.transformer.AttentionCall` and each residual
  stream (the embedding output as layer ``-1``, then every block's output) to ``residual``;
* ``decode(prompt_ids, max_new_tokens, stop_ids, probe=...)``: greedy decoding with a KV cache.
  As in Wu et al.'s reference code, the prompt minus its last token is prefilled, then decoding
  starts from the last prompt token, so every generated token has one decode step whose attention
  rows produced it; ``probe(step, token, call)`` sees each step's calls with the token it produced.
* ``decode_batch(prompts, max_new_tokens, stop_ids)``: the same greedy tokens for several prompts of
  different lengths at once: each is prefilled alone, then the caches are left-padded into one batch
  (:class:`headprobe.model.masks.KeyPadding`) and each step advances every row (no probes).

Hugging Face models are loaded with ``local_files_only`` (nothing is downloaded). Their attention
runs through a function headprobe registers with transformers' ``AttentionInterface``: it receives
the post-RoPE queries and keys (cache included), shows them to the probe and computes the output with
:func:`headprobe.model.attention.attention` (exact, never ``L x L``), so no dense mask is built either.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headprobe.model.attention import attention
from headprobe.model.kv_cache import KVCache, left_pad
from headprobe.model.masks import KeyPadding
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import AttentionCall, Transformer

AttentionProbe = Callable[[AttentionCall], None]
ResidualProbe = Callable[[int, Tensor], None]
DecodeProbe = Callable[[int, int, AttentionCall], None]  # (step, produced token, call)


class ModelLoadError(RuntimeError):
    """A model folder cannot be loaded; the message names the folder and the reason."""


@dataclass(frozen=True)
class LayerInfo:
    """Attention geometry of one layer.

    Attributes:
        index: 0-based layer index.
        layer_type: ``"sliding"`` or ``"full"``.
        n_heads: query heads.
        n_kv_heads: key/value heads.
        qk_dim: query/key width.
        v_dim: value width.
        window: keys visible per query including its own (``None`` = full causal).
    """

    index: int
    layer_type: str
    n_heads: int
    n_kv_heads: int
    qk_dim: int
    v_dim: int
    window: int | None


class ProbedModel:
    """Common interface; see the module docstring."""

    name: str
    tokenizer: ByteTokenizer | HFTokenizer
    layers: list[LayerInfo]
    max_positions: int | None
    device: torch.device

    def run(
        self, input_ids: Tensor, probe: AttentionProbe | None = None, residual: ResidualProbe | None = None
    ) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def decode(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        stop_ids: list[int] | None = None,
        probe: DecodeProbe | None = None,
    ) -> list[int]:
        """Greedy decoding of ``prompt_ids [1, n]``: prefill ``n - 1`` tokens, then one step per token
        from the last prompt token; ``probe(step, token, call)`` sees every attention call of each step
        together with the token that step produced. Stops after a token in ``stop_ids``."""
        ids = prompt_ids.to(self.device)
        state = self._prefill(ids[:, :-1])
        token = ids[:, -1:]
        out: list[int] = []
        for step in range(max_new_tokens):
            calls: list[AttentionCall] = []
            logits = self._step(state, token, calls.append if probe else None)
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            for call in calls:
                probe(step, nxt, call)  # type: ignore[misc]
            if stop_ids and nxt in stop_ids:
                break
            token = torch.tensor([[nxt]], device=self.device)
        return out

    @torch.no_grad()
    def decode_batch(
        self, prompts: list[Tensor], max_new_tokens: int, stop_ids: list[int] | None = None
    ) -> list[list[int]]:
        """Greedy continuations of several prompts ``[1, n_i]`` (lengths may differ), each cut after its
        first stop token: the tokens :meth:`decode` gives each prompt, computed together. Each prompt
        minus its last token is prefilled on its own, the caches are left-padded into one
        (:meth:`_stack`) and every step advances all rows from their last prompt tokens."""
        if len(prompts) <= 1:
            return [self.decode(p, max_new_tokens, stop_ids) for p in prompts]
        ids = [p.to(self.device) for p in prompts]
        state = self._stack([self._prefill(p[:, :-1]) for p in ids])
        token = torch.cat([p[:, -1:] for p in ids])  # [batch, 1]
        out: list[list[int]] = [[] for _ in ids]
        live = set(range(len(ids)))
        for _ in range(max_new_tokens):
            token = self._step(state, token, None)[:, -1].argmax(-1, keepdim=True)
            produced = token[:, 0].tolist()  # one device sync per step
            for row in sorted(live):
                out[row].append(produced[row])
                if stop_ids and out[row][-1] in stop_ids:
                    live.discard(row)
            if not live:
                break
        return out

    def _prefill(self, ids: Tensor) -> Any:
        """Run ``ids [1, n]`` (possibly empty) into a fresh KV cache; returns the decoding state."""
        raise NotImplementedError

    def _stack(self, states: list[Any]) -> Any:
        """One left-padded decoding state from prefilled states of different lengths."""
        raise NotImplementedError

    def _step(self, state: Any, token: Tensor, probe: AttentionProbe | None) -> Tensor:
        """One token per row ``[batch, 1]`` through the cache; returns logits ``[batch, 1, vocab]``."""
        raise NotImplementedError

    def logits(self, input_ids: Tensor) -> Tensor:
        """Next-token logits ``[batch, seq, vocab]`` of a plain forward pass (no probes)."""
        raise NotImplementedError

    def kv_cache_bytes(self, tokens: int) -> int:
        """Bytes of one sequence's KV cache after ``tokens`` tokens (sliding layers keep ``window`` keys)."""
        element = next(iter(self.parameters())).element_size()
        return sum(
            element * info.n_kv_heads * (info.qk_dim + info.v_dim) * min(tokens, info.window or tokens)
            for info in self.layers
        )

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (for sizes and dtypes)."""
        raise NotImplementedError

    def check_length(self, length: int) -> None:
        """Raise when ``length`` tokens exceed the model's positions."""
        if self.max_positions is not None and length > self.max_positions:
            raise ValueError(
                f"{self.name}: {length:,} tokens exceed the model's {self.max_positions:,} positions; use shorter "
                "--lengths (or raise the model's position limit if it extrapolates)"
            )


# ---------------------------------------------------------------------------------------------
# Our checkpoints
# ---------------------------------------------------------------------------------------------
class HeadprobeModel(ProbedModel):
    """A :class:`headprobe.model.transformer.Transformer` checkpoint."""

    def __init__(self, model: Transformer, tokenizer: ByteTokenizer | HFTokenizer, name: str) -> None:
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.device = next(model.parameters()).device
        cfg = model.cfg
        self.layers = [
            LayerInfo(i, cfg.layer_type(i), a.n_heads, a.kv_heads, a.qk_head_dim, a.v_head_dim, a.window)
            for i, a in ((i, cfg.attention(i)) for i in range(cfg.n_layers))
        ]
        self.max_positions = None  # RoPE has no table limit; cfg.max_seq_len is the trained length
        self.trained_length = cfg.max_seq_len

    @contextlib.contextmanager
    def _residual_hooks(self, residual: ResidualProbe | None) -> Iterator[None]:
        if residual is None:
            yield
            return
        hooks = [("hook_embed", lambda x, hook: residual(-1, x))]
        hooks += [(f"blocks.{i}.hook_resid_post", lambda x, hook, i=i: residual(i, x)) for i in range(len(self.layers))]
        with self.model.hooks(fwd_hooks=hooks):
            yield

    @torch.no_grad()
    def run(
        self, input_ids: Tensor, probe: AttentionProbe | None = None, residual: ResidualProbe | None = None
    ) -> None:
        probing = self.model.probe(probe) if probe is not None else contextlib.nullcontext()
        with probing, self._residual_hooks(residual):
            self.model(input_ids.to(self.device), last_only=True)

    @torch.no_grad()
    def logits(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids.to(self.device))

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def _prefill(self, ids: Tensor) -> KVCache:
        cache = KVCache(self.model.cfg)
        if ids.shape[1]:
            self.model(ids, cache=cache, last_only=True)
        return cache

    def _stack(self, states: list[KVCache]) -> KVCache:
        return KVCache.stack(states)

    def _step(self, state: KVCache, token: Tensor, probe: AttentionProbe | None) -> Tensor:
        with self.model.probe(probe) if probe else contextlib.nullcontext():
            return self.model(token, cache=state, last_only=True)


# ---------------------------------------------------------------------------------------------
# Hugging Face models
# ---------------------------------------------------------------------------------------------
_ACTIVE: list[AttentionProbe] = []  # probes of the HF forward pass in progress
_PADDING: list[tuple[Tensor, int]] = []  # (pad [batch], key-axis length incl. new tokens) of a batched step
_IMPL = "headprobe"


def _hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function: post-RoPE ``query [B, H, Lq, D]``, ``key``/``value``
    ``[B, Hkv, Lk, D]`` (cache included), bottom-right aligned; causal plus the layer's window."""
    if kwargs.get("softcap") is not None:
        raise ModelLoadError("attention logit soft-capping (Gemma 2 style) is not supported by headprobe's probes")
    window = kwargs.get("sliding_window")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if _ACTIVE:
        call = AttentionCall(
            layer=module.layer_idx,
            layer_type="sliding" if window else "full",
            q=query,
            k=key,
            window=window,
            scale=scale,
            key_start=-1,  # filled in by the model wrapper, which knows the position
        )
        for probe in _ACTIVE:
            probe(call)
    padding = None
    if _PADDING:
        pad, seen = _PADDING[-1]  # row b's first pad[b] entries of the seen tokens are padding
        padding = KeyPadding.of_call(pad, seen - key.shape[2])
    out = attention(query, key, value, window=window, scale=scale, padding=padding)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    """headprobe's attention applies causality and windows itself: no dense mask is needed."""
    return None


def _register_hf() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(_IMPL, _hf_attention)
    AttentionMaskInterface.register(_IMPL, _no_mask)


def _hf_windows(config) -> list[int | None]:
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    if window and getattr(config, "use_sliding_window", True):
        return [window] * n
    return [None] * n


class HFModel(ProbedModel):
    """A Hugging Face causal LM from a local folder (config.json + safetensors + tokenizer)."""

    def __init__(self, path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoModelForCausalLM

        _register_hf()
        try:
            self.hf = AutoModelForCausalLM.from_pretrained(
                str(path), local_files_only=True, attn_implementation=_IMPL, dtype=dtype
            ).to(device)
        except (OSError, ValueError, KeyError) as err:
            raise ModelLoadError(f"{path}: cannot load as a Hugging Face causal LM ({err})") from None
        self.hf.eval()
        self.name, self.device = path.name, torch.device(device)
        self.tokenizer = HFTokenizer(path)
        cfg = self.hf.config
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.layers = [
            LayerInfo(i, "sliding" if w else "full", heads, kv, head_dim, head_dim, w)
            for i, w in enumerate(_hf_windows(cfg))
        ]
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self._decoder_layers = self._find_layers()
        # transformers renamed `past_key_values` to `cache` (5.24 warns about the old name)
        self._cache_arg = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"

    def _find_layers(self):
        inner = getattr(self.hf, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise ModelLoadError(f"{self.name}: no `model.layers` decoder stack (Llama/Qwen/Mistral/Gemma layout)")
        return layers

    @contextlib.contextmanager
    def _probing(self, probe: AttentionProbe | None, position: int, residual: ResidualProbe | None):
        handles = []
        if probe is not None:

            def with_positions(call: AttentionCall) -> None:
                q_len, k_len = call.q.shape[2], call.k.shape[2]
                info = self.layers[call.layer]
                if (call.window or None) != info.window:
                    raise ModelLoadError(
                        f"{self.name}: layer {call.layer} ran with window {call.window}, config says {info.window}"
                    )
                start = position + q_len - k_len
                probe(AttentionCall(call.layer, info.layer_type, call.q, call.k, call.window, call.scale, start))

            _ACTIVE.append(with_positions)
        if residual is not None:

            def pre(module, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                residual(-1, hidden)

            handles.append(self._decoder_layers[0].register_forward_pre_hook(pre, with_kwargs=True))
            for i, layer in enumerate(self._decoder_layers):

                def post(module, args, output, i=i):
                    residual(i, output[0] if isinstance(output, tuple) else output)

                handles.append(layer.register_forward_hook(post))
        try:
            yield
        finally:
            if probe is not None:
                _ACTIVE.pop()
            for handle in handles:
                handle.remove()

    @torch.no_grad()
    def run(self, input_ids, probe=None, residual=None):
        with self._probing(probe, 0, residual):
            self.hf(input_ids=input_ids.to(self.device), use_cache=False, logits_to_keep=1)

    @torch.no_grad()
    def logits(self, input_ids: Tensor) -> Tensor:
        return self.hf(input_ids=input_ids.to(self.device), use_cache=False).logits

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.hf.parameters()

    def _prefill(self, ids: Tensor) -> dict[str, Any]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        if ids.shape[1]:
            self.hf(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_arg: cache})
        return {"cache": cache, "position": ids.shape[1]}

    def _stack(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        from transformers import DynamicCache

        total = max(s["position"] for s in states)
        merged = DynamicCache(config=self.hf.config)
        for i, layer in enumerate(merged.layers):
            sources = [s["cache"].layers[i] for s in states]
            k = left_pad([src.keys if src.is_initialized else None for src in sources])
            v = left_pad([src.values if src.is_initialized else None for src in sources])
            if k is not None and v is not None:
                layer.update(k, v)
                if hasattr(layer, "cumulative_length"):  # sliding layers: tokens seen, not entries kept
                    layer.cumulative_length = total
        pad = torch.tensor([total - s["position"] for s in states], dtype=torch.long, device=self.device)
        return {"cache": merged, "position": total, "pad": pad}

    def _step(self, state: dict[str, Any], token: Tensor, probe: AttentionProbe | None) -> Tensor:
        pad = state.get("pad")
        extra: dict[str, Any] = {}
        if pad is not None:
            if probe is not None:
                raise ValueError("probes see one unpadded sequence: decode probed samples one at a time")
            extra["position_ids"] = (state["position"] - pad)[:, None]  # each row's own position
            _PADDING.append((pad, state["position"] + 1))
        try:
            with self._probing(probe, state["position"], None):
                cache = {self._cache_arg: state["cache"]}
                out = self.hf(input_ids=token, use_cache=True, logits_to_keep=1, **cache, **extra)
        finally:
            if pad is not None:
                _PADDING.pop()
        state["position"] += 1
        return out.logits


DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
}


def parse_dtype(name: str | None) -> torch.dtype | None:
    """``--dtype`` names to torch dtypes; ``None`` keeps the checkpoint's own (float32 for HF models)."""
    if name is None:
        return None
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> ProbedModel:
    """Our checkpoint folder or a local Hugging Face model folder, as a :class:`ProbedModel`."""
    from headprobe.model.checkpoint import CONFIG_FILE, CheckpointError, load_checkpoint

    path = Path(path)
    if not path.is_dir():
        raise ModelLoadError(f"model folder {path} does not exist")
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise ModelLoadError(f"{config_file} is missing: {path} is neither a headprobe checkpoint nor an HF model")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ModelLoadError(f"{config_file} is not valid JSON: {err}") from None
    if "model_type" in config:  # Hugging Face
        return HFModel(path, device=device, dtype=dtype or torch.float32)
    try:
        model, tokenizer = load_checkpoint(path, device=device, dtype=dtype)
    except CheckpointError as err:
        raise ModelLoadError(str(err)) from None
    return HeadprobeModel(model, tokenizer, path.name)
