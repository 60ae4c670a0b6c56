"""Hugging Face causal LMs from a local folder behind the :class:`~headprobe.hooked.base.HookedModel` interface.

Models are loaded with ``local_files_only`` (nothing is downloaded). Their attention runs through a
function headprobe registers with transformers' ``AttentionInterface``: it receives the post-RoPE
queries and keys (cache included) and hands them, as an :class:`~headprobe.model.seam.AttentionCall`,
to the model's :class:`~headprobe.model.seam.Seam`, which shows them to the hooks and computes the
output with :func:`headprobe.model.attention.attention` (exact, never ``L x L``); a mask function
that builds nothing is registered too, so no dense mask exists either.

What the attention function needs to know about the forward pass in progress (the model's seam and
layers, the position of the first new token, the left padding of a batched step) travels with each
call as a :class:`ForwardContext` in the keyword argument ``headprobe``: transformers hands every
keyword argument of a forward call down to the attention calls. There is no module state.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel, ResidualHook
from headprobe.hooked.errors import ModelLoadError
from headprobe.hooked.stops import declared_stop_tokens
from headprobe.model.attention import attention
from headprobe.model.config import LayerInfo, LayerType
from headprobe.model.kv_cache import left_pad
from headprobe.model.masks import KeyPadding
from headprobe.model.seam import AttentionCall, AttentionHook, Seam
from headprobe.model.tokenizer import HFTokenizer

_IMPL = "headprobe"


@dataclass(frozen=True, eq=False)
class ForwardContext:
    """One forward call of a Hugging Face model, as its attention calls need to know it.

    Attributes:
        name: the model's name (for error messages).
        layers: the model's layer geometry (windows and types as the config states them).
        seam: where the calls go (hooks, then the attention backend).
        position: absolute position of the first new token (padded coordinates in a batched step).
        pad: ``[batch]`` left padding of a batched decode step, ``None`` otherwise.
    """

    name: str
    layers: list[LayerInfo]
    seam: Seam
    position: int
    pad: Tensor | None = None

    def call(self, layer: int, q: Tensor, k: Tensor, window: int | None, scale: float) -> AttentionCall:
        info = self.layers[layer]
        if window != info.window:
            raise ModelLoadError(f"{self.name}: layer {layer} ran with window {window}, config says {info.window}")
        key_start = self.position + q.shape[2] - k.shape[2]
        padding = None if self.pad is None else KeyPadding.of_call(self.pad, key_start)
        return AttentionCall(layer, info.layer_type, q, k, window, scale, key_start, padding)


def _hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, headprobe=None, **kwargs):
    """transformers attention function: post-RoPE ``query [B, H, Lq, D]``, ``key``/``value``
    ``[B, Hkv, Lk, D]`` (cache included), bottom-right aligned; causal plus the layer's window."""
    if kwargs.get("softcap") is not None:
        raise ModelLoadError("attention logit soft-capping (Gemma 2 style) is not supported by headprobe's hooks")
    window = kwargs.get("sliding_window") or None
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if headprobe is None:  # the HF model called directly, outside a HookedModel: plain exact attention
        out = attention(query, key, value, window=window, scale=scale)
    else:
        out = headprobe.seam(headprobe.call(module.layer_idx, query, key, window, scale), value)
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    """headprobe's attention applies causality and windows itself: no dense mask is needed."""
    return None


def _register_hf() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(_IMPL, _hf_attention)
    AttentionMaskInterface.register(_IMPL, _no_mask)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights") off while the block runs: headprobe's
    commands draw their own progress, and a library call draws nothing."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _hf_windows(config) -> list[int | None]:
    n = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    if window and getattr(config, "use_sliding_window", True):
        return [window] * n
    return [None] * n


# config.json keys that name or describe a model's files rather than its forward pass
NOT_ARCHITECTURE = ("_name_or_path", "name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash")


class HFModel(HookedModel):
    """A Hugging Face causal LM from a local folder (config.json + safetensors + tokenizer)."""

    def __init__(
        self,
        path: Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        name: str | None = None,
        source: dict[str, Any] | None = None,
    ) -> None:
        """``path``: the model folder; ``name``: the model's name (default the folder's); ``source``: what the
        folder was converted from, for the records (:mod:`headprobe.hooked.gguf`)."""
        from transformers import AutoModelForCausalLM

        _register_hf()
        try:
            with quiet_transformers():
                self.hf = AutoModelForCausalLM.from_pretrained(
                    str(path), local_files_only=True, attn_implementation=_IMPL, dtype=dtype
                ).to(device)
        except Exception as err:  # transformers' own: OSError, ValueError, size mismatches, config validators...
            reason = " ".join(str(err).split()) or type(err).__name__
            if source is not None:  # headprobe's own conversion of a GGUF file: changed since it was written
                raise ModelLoadError(
                    f"{path}, the conversion of {source.get('file', 'a GGUF file')}, cannot be loaded ({reason}): "
                    "it is damaged; delete that folder and rerun to convert the file again"
                ) from None
            raise ModelLoadError(
                f"{path}: cannot load as a Hugging Face causal LM ({reason}); check that its config.json describes "
                "its weights and that transformers supports the architecture"
            ) from None
        self.hf.eval()
        self.name, self.device, self.folder, self.source = name or path.name, torch.device(device), path, source
        self.tokenizer = HFTokenizer(path)
        self.stop_tokens = declared_stop_tokens(path, self.tokenizer)
        self.prompt_start = list(self.tokenizer.default_prefix)  # as the model's own inputs began
        cfg = self.hf.config
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        self.layers = [
            LayerInfo(i, LayerType.SLIDING if w else LayerType.FULL, heads, kv, head_dim, head_dim, w)
            for i, w in enumerate(_hf_windows(cfg))
        ]
        self._seam = Seam()
        self.max_positions = getattr(cfg, "max_position_embeddings", None)
        self.d_model = cfg.hidden_size
        self.d_ff = getattr(cfg, "intermediate_size", 4 * cfg.hidden_size)
        self._decoder_layers = self._find_layers()
        # transformers renamed `past_key_values` to `cache` (5.24 warns about the old name)
        self._cache_arg = "cache" if "cache" in inspect.signature(self.hf.forward).parameters else "past_key_values"

    @property
    def seam(self) -> Seam:
        return self._seam

    def _find_layers(self):
        inner = getattr(self.hf, "model", None)
        layers = getattr(inner, "layers", None)
        if layers is None:
            raise ModelLoadError(f"{self.name}: no `model.layers` decoder stack (Llama/Qwen/Mistral/Gemma layout)")
        return layers

    def _context(self, position: int, pad: Tensor | None = None) -> dict[str, ForwardContext]:
        """The keyword argument that carries this forward call's context down to every attention call."""
        return {"headprobe": ForwardContext(self.name, self.layers, self.seam, position, pad)}

    @contextlib.contextmanager
    def _residual_hooks(self, residual: ResidualHook | None) -> Iterator[None]:
        if residual is None:
            yield
            return

        def pre(module, args, kwargs):
            residual(-1, args[0] if args else kwargs["hidden_states"])

        handles = [self._decoder_layers[0].register_forward_pre_hook(pre, with_kwargs=True)]
        for i, layer in enumerate(self._decoder_layers):

            def post(module, args, output, i=i):
                residual(i, output[0] if isinstance(output, tuple) else output)

            handles.append(layer.register_forward_hook(post))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _attached(self, hook: AttentionHook | None) -> contextlib.AbstractContextManager[None]:
        return self.seam.attach(hook) if hook is not None else contextlib.nullcontext()

    @torch.no_grad()
    def run(self, input_ids: Tensor, hook: AttentionHook | None = None, residual: ResidualHook | None = None) -> None:
        with self._attached(hook), self._residual_hooks(residual):
            self.hf(input_ids=input_ids.to(self.device), use_cache=False, logits_to_keep=1, **self._context(0))

    @torch.no_grad()
    def logits(self, input_ids: Tensor) -> Tensor:
        return self.hf(input_ids=input_ids.to(self.device), use_cache=False, **self._context(0)).logits

    def output_projection(self, layer: int) -> Tensor:
        attn = self._decoder_layers[layer].self_attn
        proj = getattr(attn, "o_proj", None)
        if proj is None:
            raise ModelLoadError(
                f"{self.name}: layer {layer} has no `self_attn.o_proj` (Llama/Qwen/Mistral/Gemma layout)"
            )
        return proj.weight

    def unembedding(self) -> Tensor:
        return self.hf.get_output_embeddings().weight

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.hf.parameters()

    @property
    def module(self) -> torch.nn.Module:
        return self.hf

    def architecture(self) -> dict[str, Any]:
        return {k: v for k, v in self.hf.config.to_dict().items() if k not in NOT_ARCHITECTURE}

    def copy(self, name: str) -> HFModel:
        twin = copy.copy(self)  # the tokenizer, files and stop tokens are shared: they are read only
        twin.hf, twin.name, twin._seam = copy.deepcopy(self.hf), name, Seam()
        twin._decoder_layers = twin._find_layers()
        return twin

    def _prefill(self, ids: Tensor) -> dict[str, Any]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        if ids.shape[1]:
            self.hf(input_ids=ids, use_cache=True, logits_to_keep=1, **{self._cache_arg: cache}, **self._context(0))
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

    def _step(self, state: dict[str, Any], token: Tensor, hook: AttentionHook | None) -> Tensor:
        pad = state.get("pad")
        extra: dict[str, Any] = {self._cache_arg: state["cache"], **self._context(state["position"], pad)}
        if pad is not None:
            extra["position_ids"] = (state["position"] - pad)[:, None]  # each row's own position
        with self._attached(hook):
            out = self.hf(input_ids=token, use_cache=True, logits_to_keep=1, **extra)
        state["position"] += token.shape[1]
        return out.logits
