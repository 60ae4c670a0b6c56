"""Which weights a part set names: the parameter groups of a decoder, found by parameter name, and the part-set
syntax of ``headprobe graft --parts`` (torch-free: the command line reads it before any model loads).

A part set is one or more groups joined by ``+``; a group is a name, for the per-layer groups optionally with
layers (``:3``, ``:0-1``, ``:0-1,3``; all layers without):

===========  ================================================================================================
``embed``    the token embedding (``embed.*``, ``model.embed_tokens.*``)
``unembed``  the output projection (``lm_head.*``); one matrix with ``embed`` in a model that ties them
``norms``    every RMS/LayerNorm gain outside attention: the blocks' (with layers: those layers') and the final one
``attn``     attention: query, key, value and output projections and the query/key norms
``attn.qk``  the query and key projections and norms alone (what sets where a head looks)
``attn.vo``  the value and output projections alone (what a head writes)
``mlp``      the MLP
``param:G``  every parameter whose name matches the glob ``G`` (``param:blocks.*.attn.q_proj.*``)
``all``      every parameter (the hybrid is the donor); ``none``: none (the hybrid is the base)
===========  ================================================================================================

Our checkpoints name their blocks ``blocks.<i>``, Hugging Face models ``model.layers.<i>``; both are read.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass

from headprobe.core.errors import HeadprobeError

LAYER_GROUPS = ("attn", "attn.qk", "attn.vo", "mlp", "norms")  # the groups that take layers
GROUPS = ("embed", "unembed", "norms", "attn", "attn.qk", "attn.vo", "mlp")
TOP_LEVEL = ("embed", "unembed", "norms", "attn", "mlp")  # what `graft` grafts in turn without --parts
WHOLE = ("all", "none")

_LAYER = re.compile(r"(?:^|\.)(?:blocks|layers)\.(\d+)\.")
_ATTENTION = (".attn.", ".self_attn.")
_QK = ("q_proj", "k_proj", "q_norm", "k_norm")
_VO = ("v_proj", "o_proj")


class PartsError(HeadprobeError, ValueError):
    """A part set that cannot be read, or names nothing in a model; the message names the part and the fix."""


def layer_of(name: str) -> int | None:
    """The block a parameter belongs to (``blocks.3.mlp.up_proj.weight`` -> 3), ``None`` outside the blocks."""
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def group_of(name: str) -> str | None:
    """The finest group a parameter belongs to (``attn.qk``, ``attn.vo``, ``mlp``, ``norms``, ``embed``,
    ``unembed``), ``None`` for a parameter of none of them (only ``all`` and ``param:`` reach it)."""
    padded = f".{name}"
    if layer_of(name) is not None:
        if any(a in padded for a in _ATTENTION):
            module = name.split(".")[-2]
            return "attn.qk" if module in _QK else "attn.vo" if module in _VO else "attn"
        if ".mlp." in padded:
            return "mlp"
        return "norms" if "norm" in name or ".ln" in padded else None
    if name.startswith("lm_head."):
        return "unembed"
    if "embed" in name:
        return "embed"
    return "norms" if "norm" in name or name.startswith("ln") else None


@dataclass(frozen=True)
class Group:
    """One group of a part set: ``name`` (a :data:`GROUPS` name or ``param``), the ``layers`` it keeps
    (``None``: every layer) or, for ``param``, the ``glob``."""

    name: str
    layers: tuple[int, ...] | None = None
    glob: str = ""

    def holds(self, parameter: str) -> bool:
        if self.name == "param":
            return fnmatch.fnmatchcase(parameter, self.glob)
        group = group_of(parameter)
        if group is None or not (group == self.name or group.startswith(self.name + ".")):
            return False
        return self.layers is None or layer_of(parameter) in self.layers


@dataclass(frozen=True)
class PartSet:
    """A part set: its ``label`` (the spec as given, spaces removed) and its groups (``all`` and ``none``:
    no groups, ``whole`` says which)."""

    label: str
    groups: tuple[Group, ...] = ()
    whole: str = ""

    def select(self, names: Sequence[str]) -> list[str]:
        """The parameter ``names`` this set grafts, in their order."""
        if self.whole:
            return list(names) if self.whole == "all" else []
        return [n for n in names if any(g.holds(n) for g in self.groups)]


def _layers(text: str, spec: str) -> tuple[int, ...]:
    out: list[int] = []
    for piece in text.split(","):
        low, _, high = piece.partition("-")
        if not low.isdigit() or (high and not high.isdigit()) or (high and int(high) < int(low)):
            raise PartsError(f"`parts` {spec!r}: layers {text!r} are not LAYER, LOW-HIGH or a comma list of them")
        out += range(int(low), int(high or low) + 1)
    return tuple(sorted(set(out)))


def parse_parts(spec: str) -> PartSet:
    """A part set from its text (the module docstring); raises :class:`PartsError` naming what is wrong."""
    label = "".join(spec.split())
    if not label:
        raise PartsError("`parts`: an empty part set; name groups such as embed, mlp:0-1+attn:3, all or none")
    if label in WHOLE:
        return PartSet(label, whole=label)
    groups = []
    for piece in label.split("+"):
        name, _, rest = piece.partition(":")
        if name == "param":
            if not rest:
                raise PartsError(f"`parts` {spec!r}: param: needs a glob over parameter names (param:*.q_proj.*)")
            groups.append(Group("param", glob=rest))
        elif name not in GROUPS:
            known = ", ".join([*GROUPS, "param:GLOB", *WHOLE])
            raise PartsError(f"`parts` {spec!r}: unknown part {name!r}; choose from {known}")
        elif rest and name not in LAYER_GROUPS:
            raise PartsError(f"`parts` {spec!r}: {name} has no layers; only {', '.join(LAYER_GROUPS)} take :LAYERS")
        else:
            groups.append(Group(name, _layers(rest, spec) if rest else None))
    return PartSet(label, tuple(groups))


def default_parts() -> list[str]:
    """The part sets ``graft`` measures without ``--parts``: each top-level group in turn, and all of them."""
    return [*TOP_LEVEL, "all"]
