"""A hybrid model: BASE with DONOR's weights for the parts a part set names (:mod:`headprobe.graft.parts`).

The hybrid is a copy of BASE (:meth:`HookedModel.copy`: its own weights and seam; BASE is left as it is)
whose chosen parameters hold DONOR's values, bit for bit. BASE and DONOR must be one architecture: the same
configuration (:meth:`HookedModel.architecture`), the same parameter names and shapes; anything else is
refused before a weight is copied. A parameter BASE ties to another (our toys' and many small models' one
embedding matrix, also the unembedding) is one weight: grafting either name grafts it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from headprobe.core.errors import HeadprobeError
from headprobe.graft.parts import PartsError, PartSet, parse_parts
from headprobe.hooked.base import HookedModel


class GraftError(HeadprobeError, ValueError):
    """BASE and DONOR are not one architecture; the message names the first difference."""


def _shapes(model: HookedModel) -> dict[str, tuple[int, ...]]:
    return {n: tuple(p.shape) for n, p in model.module.named_parameters(remove_duplicate=False)}


def check_compatible(base: HookedModel, donor: HookedModel) -> None:
    """Refuse (:class:`GraftError`, one line naming the first difference) a ``donor`` whose weights cannot stand
    in ``base``: another kind of model, another configuration, other parameter names or shapes."""
    if type(base) is not type(donor):
        raise GraftError(f"{base.name} and {donor.name} are different kinds of model; graft within one architecture")
    a, b = base.architecture(), donor.architecture()
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    if differ:
        first = differ[0]
        raise GraftError(
            f"{base.name} and {donor.name} differ in their configuration ({', '.join(differ[:4])}"
            f"{', ...' if len(differ) > 4 else ''}: {first} {a.get(first)!r} vs {b.get(first)!r}); graft needs one "
            "architecture (the runs of one member, or checkpoints of one model)"
        )
    mine, theirs = _shapes(base), _shapes(donor)
    for name in mine.keys() | theirs.keys():
        if mine.get(name) != theirs.get(name):
            raise GraftError(
                f"{base.name} and {donor.name} differ in parameter {name} ({mine.get(name)} vs {theirs.get(name)}); "
                "graft needs one architecture"
            )


def tied_groups(model: HookedModel) -> list[list[str]]:
    """The parameter names that share one tensor, each group in the model's order (only groups of two or more)."""
    by_tensor: dict[int, list[str]] = {}
    for name, p in model.module.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(p), []).append(name)
    return [names for names in by_tensor.values() if len(names) > 1]


def selected(model: HookedModel, parts: PartSet | str) -> list[str]:
    """The parameter names of ``model`` that ``parts`` grafts, a tied weight's every name with it; raises
    :class:`PartsError` for a part set that names no parameter of the model (``none`` names none by design)."""
    parts = parse_parts(parts) if isinstance(parts, str) else parts
    names = [n for n, _ in model.module.named_parameters(remove_duplicate=False)]
    chosen = set(parts.select(names))
    for group in tied_groups(model):
        if chosen & set(group):
            chosen |= set(group)
    if not chosen and parts.whole != "none":
        raise PartsError(
            f"`parts` {parts.label!r} names no parameter of {model.name}; its groups: embed, unembed, norms, attn, "
            f"attn.qk, attn.vo, mlp (first parameter names: {', '.join(names[:3])})"
        )
    return [n for n in names if n in chosen]


def grafted(base: HookedModel, donor: HookedModel, parts: PartSet | str | Sequence[str]) -> HookedModel:
    """``base`` with ``donor``'s weights for ``parts`` (a part set, its text such as ``"mlp:0-1+attn:3"``, or
    ``"all"``/``"none"``), as a new model of ``base``'s kind named ``base+donor[parts]``; ``base`` and
    ``donor`` are not changed. Raises :class:`GraftError` for two architectures, :class:`PartsError` for a
    part set that names nothing, both before any weight is copied."""
    check_compatible(base, donor)
    if not isinstance(parts, PartSet | str):
        parts = "+".join(parts)
    parts = parse_parts(parts) if isinstance(parts, str) else parts
    names = selected(base, parts)
    hybrid = base.copy(f"{base.name}+{donor.name}[{parts.label}]")
    mine = dict(hybrid.module.named_parameters(remove_duplicate=False))
    theirs = dict(donor.module.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name in names:
            mine[name].copy_(theirs[name].to(mine[name].device))
    return hybrid
