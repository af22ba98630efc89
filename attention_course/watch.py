"""Watching how a result was computed: lesson 11's "never forms the full matrix" made checkable.

A :class:`Watched` tensor lets every torch operation run as usual and notes, on each result
computed from it, whether a step on the way saw too much at once (a full ``T_q x T_k`` score
matrix, ``scaled_dot_product_attention``, or whole rows of ``N`` entries). The note travels with
the data. It answers nothing: it only says *how* something was computed, so the lesson's checks
can see it wherever the student's function runs.

A :class:`CallWatch` watches one call at the level of every torch operation it makes, on watched
and plain tensors alike: a forbidden function called by any of its names (lesson 05's "no
torch.softmax" is not fooled by ``torch._softmax``), a watched input taken out of torch whole
(numpy, ``tolist``) or turned into a plain tensor, and the largest tensor the call made.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


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

    _rule: Rule | None = None

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


# ------------------------------------------------------------ watching one call


# operations that take a whole tensor out of torch, where no watch can follow what is done with it
_CONVERSIONS = {
    "numpy", "tolist", "item", "__array__", "tensor", "as_tensor", "asarray", "__reduce_ex__", "__dlpack__",
    "untyped_storage", "storage", "_typed_storage", "data_ptr", "__float__", "__int__", "__index__",
}  # fmt: skip
_METADATA = {"__get__", "size", "dim", "numel", "element_size", "is_floating_point", "__len__", "stride"}


def _base(name: str) -> str:
    """A function's name without overload or private prefixes: '_softmax.default' -> 'softmax'."""
    return name.split(".")[0].lstrip("_")


def _resolve_name(qualified: str) -> Any:
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
            for part in parts[cut:]:
                owner = getattr(owner, part)
            return owner
        except (ImportError, AttributeError):
            continue
    return None


def _holds_too_much(rule: Rule, t: torch.Tensor) -> bool:
    shape = tuple(t.shape)
    if rule.kind == "row":
        return rule.N in shape
    return rule.T_k in shape or rule.T_q * rule.T_k in shape


class CallWatch(TorchFunctionMode):
    """While one call of a student's function runs: the forbidden functions it calls (by any alias),
    how lesson 11's watched inputs were read, and the largest tensor it made.

    It sees every torch operation the call makes at its own level, on watched and plain tensors alike,
    so a private alias (``torch._softmax``), the C binding or a watched input turned into a plain
    tensor is seen too. ``calls``: forbidden names called; ``note``: (kind, sentence) or None;
    ``largest``: (bytes, shape, dtype) of the largest tensor an operation returned.
    """

    def __init__(self, forbidden: list[str] | tuple[str, ...] = (), inputs: Any = ()) -> None:
        super().__init__()
        self.forbidden = [str(n) for n in forbidden]
        self._objects = {}
        for name in self.forbidden:
            obj = _resolve_name(name)
            if obj is not None:
                self._objects.setdefault(id(obj), name)
        self.calls: list[str] = []
        self.largest: tuple[int, tuple[int, ...], torch.dtype] | None = None
        self.note: tuple[str, str] | None = None
        watched_inputs = [t for t in all_tensors(inputs) if isinstance(t, Watched)]
        rules = [t._rule for t in watched_inputs if t._rule is not None and t._rule.kind in ("row", "matrix")]
        self.rule: Rule | None = rules[0] if rules else None
        self._shapes = {tuple(t.shape) for t in watched_inputs}
        self.read = False

    def _forbidden_name(self, func: Any) -> str | None:
        name = self._objects.get(id(func))
        if name is not None:
            return name
        raw = _name(func).split(".")[0]
        for name in self.forbidden:  # the name itself first (torch._softmax), then its family
            if name.rsplit(".", 1)[-1] == raw:
                return name
        seen = _base(raw)
        if seen.startswith("special_"):
            seen = seen[len("special_") :]
        for name in self.forbidden:
            want = _base(name.rsplit(".", 1)[-1])
            if seen == want or seen.endswith("_" + want):
                return name
            if want.startswith("scaled_dot_product") and "scaled_dot_product" in seen:
                return name
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        called = self._forbidden_name(func) if self.forbidden else None
        if called is not None and called not in self.calls:
            self.calls.append(called)
        out = func(*args, **kwargs)
        try:
            self._look(func, all_tensors(args) + all_tensors(kwargs), all_tensors(out))
        except Exception:  # noqa: BLE001 - watching never changes what the student's code gets
            pass
        return out

    def _look(self, func: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        for t in outputs:
            size = t.numel() * t.element_size()
            if self.largest is None or size > self.largest[0]:
                self.largest = (size, tuple(t.shape), t.dtype)
        rule = self.rule
        if rule is None:
            return
        name = _name(func)
        mine = [t for t in inputs if isinstance(t, Watched) and t._rule is not None]
        if mine and (outputs or name in _CONVERSIONS) and name not in _METADATA:
            self.read = True
        if self.note is not None:
            return
        if name in _CONVERSIONS:
            for t in mine:
                if _holds_too_much(rule, t):
                    self.note = (
                        "whole",
                        f"`{name}` took a tensor of shape {tuple(t.shape)} out of torch at once "
                        "(the watch cannot follow what is computed from it)",
                    )
                    return
        if rule.kind == "matrix":
            floating = [t for t in outputs if t.is_floating_point()]
            self.note = _judge(rule, func, inputs, floating)
        elif name not in _SELECTS and outputs:
            for t in inputs:
                if not isinstance(t, Watched) and t.is_floating_point() and tuple(t.shape) in self._shapes:
                    self.note = (
                        "row",
                        f"`{name}` was applied to a tensor of shape {tuple(t.shape)}, which holds whole rows "
                        f"of N = {rule.N} entries",
                    )
                    return

    def verdict(self, value: Any) -> tuple[str, str] | None:
        """The note for a call that returned ``value``: what was seen, or that the inputs were never read."""
        if self.rule is None:
            return None
        found = note_of(value) or self.note
        if found is None and not self.read:
            found = (
                "unseen",
                "its result was computed without the watch seeing its inputs being read "
                "(e.g. after turning them into plain tensors)",
            )
        return found


def mark(value: Any, note: tuple[str, str] | None) -> Any:
    """value with note put on its first tensor unless a tensor of it already carries one."""
    if note is None or note_of(value) is not None:
        return value
    for t in all_tensors(value):
        try:
            t._note = note
            return value
        except (AttributeError, RuntimeError):
            continue
    return value
