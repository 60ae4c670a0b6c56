"""The interface every analysed model offers: :class:`HookedModel`.

* ``tokenizer`` (``encode``/``decode``/special ids), ``layers`` (a :class:`LayerInfo` per layer:
  type, head counts, window), ``max_positions`` and ``device``;
* ``run(input_ids, hook=..., residual=...)``: a forward pass that hands every attention layer's
  :class:`~headprobe.model.seam.AttentionCall` (post-RoPE queries and keys) to ``hook`` and each
  residual stream (the embedding output as layer ``-1``, then every block's output) to ``residual``;
* ``decode(prompt_ids, max_new_tokens, stop_ids, hook=...)``: greedy decoding with a KV cache.
  As in Wu et al.'s reference code, the prompt minus its last token is prefilled, then decoding
  starts from the last prompt token, so every generated token has one decode step whose attention
  rows produced it; ``hook(step, token, call)`` sees each step's calls with the token it produced.
* ``decode_batch(prompts, max_new_tokens, stop_ids)``: the same greedy tokens for several prompts of
  different lengths at once: each is prefilled alone, then the caches are left-padded into one batch
  (:class:`headprobe.model.masks.KeyPadding`) and each step advances every row (no hooks).

Implementations: :class:`headprobe.hooked.ours.HeadprobeModel` (our checkpoints) and
:class:`headprobe.hooked.hf.HFModel` (Hugging Face causal LMs from a local folder).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from headprobe.core.errors import SettingError
from headprobe.hooked.ablation import AblationMode, Head, HeadAblation, ablated
from headprobe.hooked.stops import StopTokens, describe_stops
from headprobe.model.budget import MemoryEstimate, kv_cache_bytes, pass_memory
from headprobe.model.config import LayerInfo
from headprobe.model.decoding import greedy
from headprobe.model.seam import AttentionCall, AttentionHook, Seam
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.text.prompt_format import PromptFormatError, Wrapper, has_chat_template, resolve_wrapper

ResidualHook = Callable[[int, Tensor], None]  # (layer, residual stream [batch, pos, d_model]); layer -1 = embedding
DecodeHook = Callable[[int, int, AttentionCall], None]  # (step, produced token, call)

__all__ = ["AttentionHook", "DecodeHook", "HookedModel", "LayerInfo", "ResidualHook", "with_prompt_start"]


def with_prompt_start(start: Sequence[int], ids: list[int]) -> list[int]:
    """``ids`` behind ``start``, unless they already begin with it (e.g. a chat template that writes its
    own BOS), so a prompt never starts twice."""
    start = list(start)
    return ids if ids[: len(start)] == start else start + ids


class HookedModel:
    """Common interface; see the module docstring.

    Attributes:
        prompt_start: the ids every evaluation and analysis input begins with: **the one prompt-start
            rule** is that a prompt begins as the model's training inputs began. Our checkpoints are
            trained on packed documents joined by end-of-document tokens, never behind a BOS, so
            nothing is prepended; a Hugging Face model gets what its tokenizer file adds by default
            (Llama's or Gemma's BOS, nothing for Qwen): :attr:`HFTokenizer.default_prefix`.
    """

    name: str
    tokenizer: ByteTokenizer | HFTokenizer
    layers: list[LayerInfo]
    max_positions: int | None
    device: torch.device
    prompt_start: list[int]
    d_model: int  # residual-stream width
    d_ff: int  # MLP hidden width
    folder: Path | None = None  # the folder holding the model's files (a GGUF file's converted folder)
    source: dict[str, Any] | None = None  # where the folder came from when converted (:mod:`headprobe.hooked.gguf`)
    stop_tokens: StopTokens = MappingProxyType({})  # every end id the model declares, with the files declaring it

    @property
    def stop_ids(self) -> list[int]:
        """The ids greedy decoding stops after: every end-of-text and end-of-turn id the model declares
        (:mod:`headprobe.hooked.stops`)."""
        return list(self.stop_tokens)

    @property
    def seam(self) -> Seam:
        """Where the model's attention calls pass (:class:`~headprobe.model.seam.Seam`)."""
        raise NotImplementedError

    def ablate(self, heads: Sequence[Head], mode: AblationMode | str = "zero") -> AbstractContextManager[HeadAblation]:
        """Ablate ``heads`` (``zero`` or ``mean``, :mod:`headprobe.hooked.ablation`) in every forward pass while
        the context is open; always removed. Heads the model lacks raise :class:`AblationError` at once::

            with model.ablate([Head(17, 3), Head(18, 7)], "zero"):
                tokens = model.decode(ids, 32, model.stop_ids)
        """
        return ablated(self.seam, self.layers, heads, mode, self.name)

    def encode_prompt(self, text: str) -> list[int]:
        """``text`` tokenised, behind :attr:`prompt_start` (see :func:`with_prompt_start`)."""
        return with_prompt_start(self.prompt_start, self.tokenizer.encode(text))

    def prompt_wrapper(self, prompt_format: str) -> Wrapper:
        """The wrapper a ``prompt_format`` (``auto``/``chat``/``plain`` or a custom wrapper) gives this
        model: ``auto`` is its chat template where its files have one (:mod:`headprobe.text.prompt_format`)."""
        try:
            return resolve_wrapper(prompt_format, self.folder)
        except PromptFormatError as err:
            raise PromptFormatError(f"{self.name}: {err}") from None

    def facts(self) -> dict[str, Any]:
        """What the results record about the model itself: its folder, the file it was converted from,
        the end tokens decoding stops on (with the files that declare them), whether it has a chat
        template, and the ids every prompt starts with."""
        return {
            "folder": None if self.folder is None else str(self.folder),
            "source": self.source,
            "stop_tokens": describe_stops(self.stop_tokens, self.tokenizer),
            "chat_template": has_chat_template(self.folder),
            "prompt_start": list(self.prompt_start),
        }

    def run(self, input_ids: Tensor, hook: AttentionHook | None = None, residual: ResidualHook | None = None) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def prefill(self, ids: Tensor, hook: AttentionHook | None = None, chunk: int | None = None) -> Any:
        """The decoding state after running ``ids [1, n]`` into a fresh KV cache, ``chunk`` tokens at a time
        (``None``: all at once), each attention call shown to ``hook``. Chunks keep the activations at
        ``O(chunk)`` tokens on top of the cache, so long prompts fit; every query still sees every key
        it would see in one pass (the cache holds them)."""
        ids = ids.to(self.device)
        n = ids.shape[1]
        if hook is None and (chunk is None or n <= chunk):
            return self._prefill(ids)
        state = self._prefill(ids[:, :0])
        step = max(1, chunk or n)
        for start in range(0, n, step):
            self._step(state, ids[:, start : start + step], hook)
        return state

    @torch.no_grad()
    def decode(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        stop_ids: list[int] | None = None,
        hook: DecodeHook | None = None,
        state: Any = None,
        on_step: Callable[[int], None] | None = None,
    ) -> list[int]:
        """Greedy decoding of ``prompt_ids [1, n]``: prefill ``n - 1`` tokens, then one step per token
        from the last prompt token; ``hook(step, token, call)`` sees every attention call of each step
        together with the token that step produced. Stops after a token in ``stop_ids``. ``state``: the
        first ``n - 1`` tokens already prefilled (:meth:`prefill`). ``on_step(n)`` hears after each step
        how many tokens were produced."""
        ids = prompt_ids.to(self.device)
        state = self._prefill(ids[:, :-1]) if state is None else state
        produced = 0

        def step(token: Tensor) -> Tensor:  # the next token; the step's attention calls shown to ``hook``
            nonlocal produced
            calls: list[AttentionCall] = []
            nxt = self._step(state, token, calls.append if hook else None)[:, -1].argmax(-1)
            if calls:
                token_id = int(nxt[0])  # one device sync per step, not per attention call
                for call in calls:
                    hook(produced, token_id, call)  # type: ignore[misc]
            produced += 1
            return nxt

        return greedy(step(ids[:, -1:]), step, max_new_tokens, stop_ids, on_step)[0]

    @torch.no_grad()
    def decode_batch(
        self,
        prompts: list[Tensor],
        max_new_tokens: int,
        stop_ids: list[int] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Greedy continuations of several prompts ``[1, n_i]`` (lengths may differ), each cut after its
        first stop token: the tokens :meth:`decode` gives each prompt, computed together. Each prompt
        minus its last token is prefilled on its own, the caches are left-padded into one
        (:meth:`_stack`) and every step advances all rows from their last prompt tokens. ``on_step(n)``
        hears after each step how many tokens the batch has produced (progress within a batch)."""
        if len(prompts) <= 1:
            return [self.decode(p, max_new_tokens, stop_ids, on_step=on_step) for p in prompts]
        ids = [p.to(self.device) for p in prompts]
        state = self._stack([self._prefill(p[:, :-1]) for p in ids])

        def step(token: Tensor) -> Tensor:
            return self._step(state, token, None)[:, -1].argmax(-1)

        return greedy(step(torch.cat([p[:, -1:] for p in ids])), step, max_new_tokens, stop_ids, on_step)

    def _prefill(self, ids: Tensor) -> Any:
        """Run ``ids [1, n]`` (possibly empty) into a fresh KV cache; returns the decoding state."""
        raise NotImplementedError

    def _stack(self, states: list[Any]) -> Any:
        """One left-padded decoding state from prefilled states of different lengths."""
        raise NotImplementedError

    def _step(self, state: Any, token: Tensor, hook: AttentionHook | None) -> Tensor:
        """Tokens ``[batch, n]`` (one per row when decoding; a chunk of one prompt when prefilling) through
        the cache; returns the last position's logits ``[batch, 1, vocab]``."""
        raise NotImplementedError

    def logits(self, input_ids: Tensor) -> Tensor:
        """Next-token logits ``[batch, seq, vocab]`` of a plain forward pass (no hooks)."""
        raise NotImplementedError

    def output_projection(self, layer: int) -> Tensor:
        """Layer ``layer``'s output projection ``W_O [d_model, heads * v_dim]``: head ``h`` writes
        ``W_O[:, h * v_dim : (h + 1) * v_dim] @ z_h`` into the residual stream (``z_h`` its output ``[v_dim]``)."""
        raise NotImplementedError

    def unembedding(self) -> Tensor:
        """The unembedding ``W_U [vocab, d_model]`` (the ``lm_head`` weight; the embedding when tied), before which
        the final norm is applied in a forward pass."""
        raise NotImplementedError

    def kv_cache_bytes(self, tokens: int) -> int:
        """Bytes of one sequence's KV cache after ``tokens`` tokens (:func:`headprobe.model.budget.kv_cache_bytes`)."""
        return kv_cache_bytes(self.layers, tokens, self.bytes_per_value)

    @property
    def bytes_per_value(self) -> int:
        """Bytes of one weight (and of one cached key/value element)."""
        return next(iter(self.parameters())).element_size()

    def memory(self, tokens: int, rows: int = 0, topk: int = 0, cached_tokens: int = 0) -> MemoryEstimate:
        """Peak memory of one pass over ``tokens`` tokens (:func:`headprobe.model.budget.pass_memory`):
        streaming statistics of ``rows`` rows with top-``topk``, a KV cache of ``cached_tokens``."""
        weights = sum(p.numel() * p.element_size() for p in self.parameters())
        return pass_memory(
            self.layers,
            weights,
            self.d_model,
            self.d_ff,
            tokens,
            rows=rows,
            topk=topk,
            cached_tokens=cached_tokens,
            bytes_per_value=self.bytes_per_value,
        )

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The model's parameters (for sizes and dtypes)."""
        raise NotImplementedError

    @property
    def module(self) -> torch.nn.Module:
        """The torch module holding every weight (ours: the ``Transformer``; a Hugging Face model: its causal LM)."""
        raise NotImplementedError

    def architecture(self) -> dict[str, Any]:
        """What decides the forward pass besides the weights: the model's configuration as a dict, without its
        name, paths and training-only fields. Two models of one architecture give equal dicts."""
        raise NotImplementedError

    def copy(self, name: str) -> HookedModel:
        """The same model called ``name``, with its own copy of every weight (and its own seam): changing the
        copy's weights leaves this model as it is."""
        raise NotImplementedError

    def check_length(self, length: int) -> None:
        """Raise when ``length`` tokens exceed the model's positions."""
        if self.max_positions is not None and length > self.max_positions:
            raise SettingError(
                f"{self.name}: {length:,} tokens exceed the model's {self.max_positions:,} positions; use shorter "
                "`lengths` (or raise the model's position limit if it extrapolates)"
            )
