"""The one greedy decoding loop: :meth:`headprobe.model.transformer.Transformer.generate` and
:meth:`headprobe.hooked.HookedModel.decode` / ``decode_batch`` differ only in how they reach the first new
token (the Transformer from one prefill of the whole prompt; a hooked model by one step from the last
prompt token, so that its hooks see that step's attention calls); from there they share this loop and
its stop rule."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def greedy(
    first: Tensor,
    step: Callable[[Tensor], Tensor],
    max_new_tokens: int,
    stop_ids: list[int] | None = None,
    on_step: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """Greedy continuations of a batch, from its first new tokens ``first [batch]``: ``step(ids [batch, 1])``
    gives the next token of every row ``[batch]``. A row ends with (and includes) its first token in
    ``stop_ids``; the loop ends when every row has ended or after ``max_new_tokens`` tokens. ``on_step(n)``
    hears after each token how many each live row has.

    Returns:
        each row's new token ids, ``1 <= len <= max_new_tokens``.
    """
    stops = set(stop_ids or ())
    out: list[list[int]] = [[] for _ in range(first.shape[0])]
    live = set(range(len(out)))
    token = first
    for n in range(max_new_tokens):
        produced = token.tolist()  # one device sync per step
        for row in sorted(live):
            out[row].append(produced[row])
            if produced[row] in stops:
                live.discard(row)
        if on_step is not None:
            on_step(n + 1)
        if not live or n == max_new_tokens - 1:
            break
        token = step(token[:, None])
    return out
