"""Watching how a result was computed: lesson 11's "never forms the full matrix" made checkable.

A :class:`Watched` tensor lets every torch operation run as usual and notes, on each result
computed from it, whether a step on the way saw too much at once (a full ``T_q x T_k`` score
matrix, ``scaled_dot_product_attention``, or whole rows of ``N`` entries). The note travels with
the data. It answers nothing: it only says *how* something was computed, so the lesson's checks
can see it wherever the student's function runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rule:
    """What a case's inputs may not lead to. kind 'matrix': (T_q, T_k); kind 'row': rows of N."""

    kind: str
    T_q: int = 0
    T_k: int = 0
    N: int = 0


# operations that take a block, a view or a copy of a tensor without computing anything from whole rows
_SELECTS = {
    "__getitem__", "__len__", "__iter__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind",
    "narrow", "select", "unfold", "detach", "clone", "contiguous", "to", "float", "double", "half",
    "type", "type_as", "cpu", "cuda", "view", "view_as", "reshape", "reshape_as", "unflatten", "flatten",
    "transpose", "permute", "movedim", "moveaxis", "swapaxes", "swapdims", "unsqueeze", "squeeze", "expand",
    "expand_as", "new_full", "new_zeros", "new_ones", "new_empty", "new_tensor", "zeros_like", "ones_like",
    "full_like", "empty_like", "size", "dim", "numel", "element_size", "is_floating_point", "equal",
}  # fmt: skip

_local = threading.local()


def all_tensors(x: object) -> list[torch.Tensor]:
    """The tensors in ``x``, looking inside lists, tuples and dict values, in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in all_tensors(v)]
    return []


def _name(func) -> str:
    return getattr(func, "__name__", None) or str(func)


def _judge(
    rule: Rule, func, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
) -> tuple[str, str] | None:
    name = _name(func)
    if rule.kind == "matrix":
        if "scaled_dot_product_attention" in name:
            return "sdpa", f"it called {name}, which does the whole computation at once"
        for t in outputs:
            shape = tuple(t.shape)
            full = (
                shape.count(rule.T_q) >= 2
                if rule.T_q == rule.T_k
                else (rule.T_q in shape and rule.T_k in shape)
            )
            if full or rule.T_q * rule.T_k in shape:
                return "full", (
                    f"`{name}` made a tensor of shape {shape}: a full score matrix of "
                    f"T_q = {rule.T_q} queries by T_k = {rule.T_k} keys"
                )
    elif rule.kind == "row" and name not in _SELECTS and outputs:
        for t in inputs:
            if isinstance(t, Watched) and rule.N in tuple(t.shape):
                return "row", (
                    f"`{name}` was applied to a tensor of shape {tuple(t.shape)}, which holds whole rows "
                    f"of N = {rule.N} entries"
                )
    return None


class Watched(torch.Tensor):
    """A tensor that notes, on everything computed from it, whether a step saw too much at once."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = super().__torch_function__(func, types, args, kwargs)
        if getattr(_local, "busy", False):
            return out
        _local.busy = True
        try:
            inputs = all_tensors(args) + all_tensors(kwargs)
            rule = next((r for r in (getattr(t, "_rule", None) for t in inputs) if r is not None), None)
            if rule is None:
                return out
            outputs = all_tensors(out)
            note = next((n for n in (getattr(t, "_note", None) for t in inputs) if n is not None), None)
            if note is None:
                note = _judge(rule, func, inputs, outputs)
            targets = list(outputs)
            if _name(func).endswith("_") or _name(func) == "__setitem__":
                targets += all_tensors(args[:1])  # written in place
            targets += all_tensors(kwargs.get("out"))
            for t in targets:
                t._rule = rule
                if note is not None:
                    t._note = note
        finally:
            _local.busy = False
        return out


def watched(t: torch.Tensor, rule: Rule | None) -> torch.Tensor:
    """t as a Watched tensor following rule (None: watched but free)."""
    w = t.as_subclass(Watched)
    w._rule = rule
    return w


def note_of(x) -> tuple[str, str] | None:
    """The first note carried by a result (a tensor or a tuple of tensors)."""
    for t in all_tensors(x):
        note = getattr(t, "_note", None)
        if note is not None:
            return note
    return None
