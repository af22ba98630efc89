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

import contextlib
import ctypes
import importlib
import math
import sys
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


@dataclass(frozen=True)
class Rule:
    """What a case's inputs may not lead to. kind 'matrix': (T_q, T_k); kind 'row': rows of N.

    ``block``: the case's block_size, where more than it at once (scores of more keys, more entries of a
    row) breaks the rule too; ``free``: the case's other sizes (batch, head dims), which a tensor may hold.
    """

    kind: str
    T_q: int = 0
    T_k: int = 0
    N: int = 0
    block: int = 0
    free: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "free", tuple(self.free))  # sent to a sandbox, it comes back as a list

    @classmethod
    def rows(cls, Z: torch.Tensor, block: int) -> Rule | None:
        """Lesson 11's rule for ``fn(Z, block_size)``: each row of ``Z`` read at most ``block`` entries
        at a time (None where one block holds a whole row)."""
        N = Z.shape[-1]
        free = (*Z.shape[:-1], math.prod(Z.shape[:-1]))  # a row per entry of the rest, or all of them flat
        return cls("row", N=N, block=block, free=free) if block < N else None

    @classmethod
    def scores(cls, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, block: int) -> Rule:
        """Lesson 11's rule for ``fn(Q, K, V, block_size)``: scores for at most ``block`` keys at a time
        (kind 'free' where one block holds every key). A tensor may hold the head sizes, the batch
        sizes, their product and the queries of the whole batch at once."""
        batch = tuple(Q.shape[:-2])
        T_q, T_k = Q.shape[-2], K.shape[-2]
        free = (Q.shape[-1], V.shape[-1], *batch, math.prod(batch), T_q * math.prod(batch))
        return cls("matrix", T_q=T_q, T_k=T_k, block=block, free=free) if block < T_k else cls("free")


# operations that take a block, a view or a copy of a tensor without computing anything from whole rows
_SELECTS = {
    "__getitem__", "__len__", "__iter__", "split", "split_with_sizes", "chunk", "tensor_split", "unbind",
    "narrow", "select", "index_select", "unfold", "as_strided", "detach", "clone", "contiguous", "to", "float", "double", "half",
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


# fused attention kernels by any of their names (``torch._scaled_dot_product_flash_attention_for_cpu``, ...)
_FUSED = ("scaled_dot_product", "sdp_choice", "flash_attention", "efficient_attention", "cudnn_attention",
          "multi_head_attention", "scaled_dot_attention", "transformer_encoder")  # fmt: skip


def _too_much(rule: Rule, shape: tuple[int, ...], wide: bool = True) -> tuple[str, str] | None:
    """(kind, what) when a tensor of this shape holds more than the rule allows at once (``wide``: more
    than a block counts too, for a tensor computed from the inputs). A block with one statistic carried
    beside it (the running max put next to the block's entries with ``cat``, or stacked with the block's
    own max) is no more than a block: a size of ``block + 1`` is let pass, as shapes cannot tell the two apart."""
    if rule.kind == "row":
        if rule.N in shape:
            return "row", f"whole rows of N = {rule.N} entries"
        over = [k for k in shape if rule.block + 1 < k and k not in rule.free] if wide and rule.block else []
        if over:
            return "wide", f"{over[0]} entries of a row at once, more than block_size = {rule.block}"
        return None
    full = shape.count(rule.T_q) >= 2 if rule.T_q == rule.T_k else (rule.T_q in shape and rule.T_k in shape)
    if full or rule.T_q * rule.T_k in shape:
        return "full", f"a full score matrix of T_q = {rule.T_q} queries by T_k = {rule.T_k} keys"
    rest = list(shape)
    if rule.T_q in rest:
        rest.remove(rule.T_q)  # the queries' own dimension
    over = [k for k in rest if rule.block + 1 < k and k not in rule.free] if wide and rule.block else []
    if over:
        return "wide", f"scores of {over[0]} keys at once, more than block_size = {rule.block}"
    return None


def _judge(
    rule: Rule,
    func,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    selects: set[str] = _SELECTS,
    scores: tuple[tuple[int, ...], ...] | None = None,
) -> tuple[str, str] | None:
    """The note for one operation: inputs, the watched tensors it received (kind 'row'); outputs, all it
    made; scores (kind 'matrix'), where it computed from both the queries and the keys, the shapes of its
    inputs: its other results are judged against the block size too."""
    name = _name(func).split(".")[0]  # an aten operator without its overload: 'amax.default' -> 'amax'
    if rule.kind == "matrix":
        if any(f in name for f in _FUSED):
            return "sdpa", f"it called {name}, which does the whole computation at once"
        computed = scores is not None and name not in selects
        for t in outputs:
            shape = tuple(t.shape)
            found = _too_much(rule, shape, computed and shape not in scores)
            if found is not None:
                return found[0], f"`{name}` made a tensor of shape {tuple(t.shape)}: {found[1]}"
    elif rule.kind == "row" and name not in selects and outputs:
        for t in inputs:
            found = _too_much(rule, tuple(t.shape))
            if found is not None:
                kind, what = found
                return kind, f"`{name}` was applied to a tensor of shape {tuple(t.shape)}, which holds {what}"
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
                note = _judge(rule, func, [t for t in inputs if isinstance(t, Watched)], outputs)
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


# aten operations that take a block, a view or a copy of a tensor, or only its size, computing nothing from it
_ATEN_SELECTS = {
    "slice", "select", "view", "_unsafe_view", "_reshape_alias", "alias", "detach", "clone", "_to_copy",
    "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "split", "split_with_sizes", "unbind",
    "narrow", "unfold", "as_strided", "lift_fresh", "lift_fresh_copy", "copy", "_local_scalar_dense", "index",
    "index_select",
    "view_as_real", "view_as_complex", "_conj", "resolve_conj", "resolve_neg", "equal",
}  # fmt: skip
# aten operations whose result takes only the size of their input (no value of it)
_ATEN_SHAPED = {
    "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like",
    "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "empty_strided",
}  # fmt: skip


def _functions_off() -> bool:
    """Whether torch functions are switched off altogether (``torch._C.DisableTorchFunction``)."""
    off = getattr(torch._C, "_is_torch_function_all_disabled", None)
    return bool(off()) if off is not None else False


class _Below(TorchDispatchMode):
    """A CallWatch's eyes at PyTorch's dispatcher: every aten operation the call makes, from Python,
    TorchScript or C++, with torch functions switched on or off, by whatever name it was called."""

    def __init__(self, watch: CallWatch) -> None:
        super().__init__()
        self.watch = watch

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # else PyTorch imports torch._dynamo (a second, 800 modules) on the first operation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        inputs = all_tensors(args) + all_tensors(kwargs)
        # before the operation, which may write into its inputs
        with _own_work(), contextlib.suppress(Exception):
            self.watch._written_unseen(inputs)
        out = func(*args, **kwargs)
        with _own_work():
            try:
                self.watch._dispatched(func, inputs, all_tensors(out), _written(func, args, kwargs))
            except Exception as e:  # noqa: BLE001 - watching never changes what the student's code gets
                self.watch._failed(_name(func), e)
        return out


@contextlib.contextmanager
def _own_work() -> Any:
    """The watch's own torch calls (a tensor's storage, its bytes) are not the student's: where an
    operation reaches the dispatcher with the CallWatch still on (TorchScript), it lets them through."""
    busy, _local.busy = getattr(_local, "busy", False), True
    try:
        yield
    finally:
        _local.busy = busy


def _fingerprint(t: torch.Tensor) -> int:
    """A hash of the bytes of t's storage (on the CPU: elsewhere reading them would cost a copy)."""
    storage = t.untyped_storage()
    if storage.device.type != "cpu":
        raise ValueError("not on the CPU")
    return hash(ctypes.string_at(storage.data_ptr(), storage.nbytes())) if storage.nbytes() else 0


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors an aten operation writes into (in place, ``out=``), by its schema."""
    written = []
    for i, arg in enumerate(getattr(getattr(func, "_schema", None), "arguments", ())):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += all_tensors(args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name))
    return written


class CallWatch(TorchFunctionMode):
    """While one call of a student's function runs: the forbidden functions it calls (by any alias),
    how lesson 11's watched inputs were read, and the largest tensor it made.

    It sees every torch operation the call makes at its own level, on watched and plain tensors alike,
    so a private alias (``torch._softmax``), the C binding or a watched input turned into a plain
    tensor is seen too; and, where there are forbidden names or a rule, every aten operation at the
    dispatcher (``_Below``), so torch functions switched off, TorchScript and fused kernels under private
    names are seen as well. There it follows which storages were computed from the watched inputs, so a
    copy or a view is followed whatever its Python class. ``calls``: forbidden names called; ``note``:
    (kind, sentence) or None; ``largest``: (bytes, shape, dtype) of the largest tensor an operation returned.
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
        # what it was given, to tell whether the call reached into it (best effort: code can change these too)
        self._given = (tuple(self.forbidden), None if self.rule is None else replace(self.rule), self.calls)
        self._count = 0  # forbidden names recorded
        self._shapes = {tuple(t.shape) for t in watched_inputs}
        self.read = False
        self._held: dict[int, StorageWeakRef] = {}  # storages computed from the watched inputs
        self._from: dict[int, int] = {}  # of these, which inputs each was computed from (bit i: input i)
        self.converted = 0  # values of them taken out of torch (numpy, lists, numbers)
        if self.rule is not None:
            for i, t in enumerate(watched_inputs):
                self._hold(t, mask=1 << i)
        self._below: _Below | None = None
        self.off: tuple[str, str] | None = None  # the note for inputs read with torch functions off
        self.review: str | None = None  # what the watch could not decide, for a person to look at
        self._covered = False  # inside a torch function already recorded as forbidden
        self._made: dict[int, StorageWeakRef] = {}  # storages the watch saw made from no unseen tensor
        self._prints: dict[int, tuple[StorageWeakRef, int]] = {}  # storages made or written, as last seen
        self._dirty: set[int] = set()  # storages written since then where the watch did not see (a thread)
        self.mixed: list[tuple[str, tuple[int, ...]]] = []  # operations on the inputs and unseen tensors

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if sys._getframe(1).f_globals.get("__name__", "").partition(".")[0] not in (
            "attention_course",
            "torch",
        ):
            object.__setattr__(self, "_reached", name)  # set by code outside the watch: noted for verdict

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        object.__setattr__(self, "_reached", name)

    def __enter__(self) -> CallWatch:
        super().__enter__()
        if self.forbidden or self.rule is not None:
            self._below = _Below(self).__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._below is not None:
            try:
                self._below.__exit__(*exc)
            except Exception:  # noqa: BLE001 - the student's code took it off already
                pass
        return super().__exit__(*exc)

    def _hold(self, t: torch.Tensor, book: dict | None = None, keep: bool = True, mask: int = 0) -> None:
        """Note t's storage in book (the storages computed from the inputs: from those in mask), or take it out."""
        book = self._held if book is None else book
        try:
            storage = t.untyped_storage()
            if not keep:
                book.pop(storage._cdata, None)
            elif storage._cdata not in book:
                book[storage._cdata] = StorageWeakRef(storage)
            if book is self._held:
                self._from[storage._cdata] = self._from.get(storage._cdata, 0) | mask
        except Exception:  # noqa: BLE001 - a tensor without storage (sparse, nested) is not followed
            pass

    def _holds(self, t: torch.Tensor, book: dict | None = None) -> bool:
        try:
            storage = t.untyped_storage()
        except Exception:  # noqa: BLE001
            return False
        ref = (self._held if book is None else book).get(storage._cdata)
        return ref is not None and not ref.expired()

    def _mask(self, t: torch.Tensor) -> int:
        return self._from.get(t.untyped_storage()._cdata, 0) if self._holds(t) else 0

    def _unseen(self, t: torch.Tensor) -> bool:
        """Whether t was made, or written since, where the watch did not see it (another thread, numpy, the
        dispatcher off). A tensor on 'meta' holds no values to hide (and torch.tensor(..., device='meta')
        shows no operator)."""
        if t.is_meta:
            return False
        return self._key(t) in self._dirty or not (self._holds(t) or self._holds(t, self._made))

    @staticmethod
    def _key(t: torch.Tensor) -> int | None:
        try:
            return t.untyped_storage()._cdata
        except Exception:  # noqa: BLE001 - no storage (sparse, nested)
            return None

    def _seen_writes(self, outputs: list[torch.Tensor], written: list[torch.Tensor] | tuple = ()) -> None:
        """After an operation: what the storages it made (``outputs`` on a storage not known yet; one known
        is a view) and wrote into (``written``) hold, as the watch saw them."""
        for t, made in [(t, True) for t in outputs] + [(t, False) for t in list(written)]:
            with contextlib.suppress(Exception):  # no storage (sparse, nested), or not on the CPU
                key = self._key(t)
                known = self._prints.get(key)
                if not made or known is None or known[0].expired():
                    self._prints[key] = (StorageWeakRef(t.untyped_storage()), _fingerprint(t))

    def _written_unseen(self, tensors: list[torch.Tensor]) -> None:
        """Before an operation: mark the storages that hold other bytes than the watch last saw them hold:
        written where it does not look (another thread, numpy, ``.data``)."""
        for t in tensors if self._prints else ():
            key = self._key(t)
            known = self._prints.get(key)
            with contextlib.suppress(Exception):  # not on the CPU
                if known is not None and not known[0].expired() and known[1] != _fingerprint(t):
                    self._dirty.add(key)

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

    def _forbidden_call(self, called: str | None, frame: Any) -> None:
        """Record a forbidden name called (``frame``: where the call was made, for watches that ask)."""
        if called is not None and called not in self.calls:
            self.calls.append(called)
            self._count += 1

    def _run(self, func: Any, args: Any, kwargs: dict, frame: Any) -> Any:
        """func(*args, **kwargs), a torch function: a forbidden one is recorded by the name called here (what
        it does below is not recorded again by its aten names); a fused attention kernel is noted first."""
        called = self._forbidden_name(func) if self.forbidden else None
        self._forbidden_call(called, frame)
        if self.rule is not None and self.note is None and self.rule.kind == "matrix":
            self.note = _judge(self.rule, func, [], [])
        covered = self._covered  # set as the watch's own, twice an operation: no check of who set it
        object.__setattr__(self, "_covered", covered or called is not None)
        try:
            return func(*args, **kwargs)
        finally:
            object.__setattr__(self, "_covered", covered)

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if getattr(_local, "busy", False):  # the watch's own work (``_own_work``)
            return func(*args, **kwargs)
        out = self._run(func, args, kwargs, sys._getframe(1))
        try:
            self._look(func, all_tensors(args) + all_tensors(kwargs), all_tensors(out))
        except Exception as e:  # noqa: BLE001 - watching never changes what the student's code gets
            self._failed(_name(func), e)
        return out

    def _dispatched(self, func: Any, inputs: list, outputs: list, written: list | tuple = ()) -> None:
        """One aten operation, seen at the dispatcher."""
        if self.forbidden and not self._covered:
            self._forbidden_call(self._forbidden_name(func), sys._getframe(2))
        name = _name(func).split(".")[0]
        if self.review is None and getattr(func, "namespace", "aten") not in ("aten", "prims"):
            self.review = f"called `{name}`, an operator of its own whose work the watch cannot see"
        rule = self.rule
        if rule is None:
            return
        self._seen_writes(outputs, written)
        held = [t for t in inputs if self._holds(t)]
        if held and name not in _ATEN_SHAPED:
            if not self.read:
                self.read = True
            self.mixed.extend(
                (name, tuple(t.shape)) for t in inputs if t.is_floating_point() and self._unseen(t)
            )
            mask = 0
            for t in held:
                mask |= self._mask(t)
            for t in outputs:
                self._hold(t, mask=mask)
        else:  # made here, unless from something the watch did not see made (or values taken out of torch)
            fresh = name.startswith(
                "lift_fresh"
            )  # torch.tensor(numbers): made here, unless taken out of the inputs
            clean = not self.converted if fresh else not any(map(self._unseen, inputs))
            for t in outputs:
                self._hold(t, self._made, clean)
        if held and self.off is None and _functions_off():
            self.off = (
                "off",
                f"it switched torch functions off (torch._C.DisableTorchFunction) and read its inputs there "
                f"(`{name}`): its result was computed without the watch seeing its inputs being read",
            )
        if held and getattr(func, "namespace", "aten") not in ("aten", "prims") and self.note is None:
            self.note = (
                "opaque",
                f"it called `{name}`, an operator of its own whose work the watch cannot see",
            )
        if self.note is not None:
            return
        if rule.kind == "matrix":
            numbers = [t for t in outputs if t.is_floating_point() or t.is_complex()]
            both = held and all(any(self._mask(t) & bit for t in held) for bit in (1, 2))  # queries, keys
            scores = tuple(tuple(t.shape) for t in held) if both else None
            note = _judge(rule, func, [], numbers, _ATEN_SELECTS | _ATEN_SHAPED, scores)
        else:
            seen = held + [t for t in inputs if t.is_floating_point() and tuple(t.shape) in self._shapes]
            note = _judge(rule, func, seen, outputs, _ATEN_SELECTS | _ATEN_SHAPED)
        if note is not None:
            self.note = note

    def _failed(self, name: str, error: Exception) -> None:
        """The watch could not judge an operation (nested or sparse tensors, ...): the rule fails, else a
        person looks."""
        what = (
            f"`{name.split('.')[0]}`, which works on tensors the watch cannot judge ({type(error).__name__})"
        )
        if self.rule is not None and self.note is None:
            self.note = ("opaque", f"it called {what}")
        elif self.review is None:
            self.review = f"called {what}"

    def _look(self, func: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        for t in outputs:
            size = t.numel() * t.element_size()
            if self.largest is None or size > self.largest[0]:
                self.largest = (size, tuple(t.shape), t.dtype)
        rule = self.rule
        if rule is None:
            return
        name = _name(func)
        mine = [t for t in inputs if (isinstance(t, Watched) and t._rule is not None) or self._holds(t)]
        if mine and (outputs or name in _CONVERSIONS) and name not in _METADATA and not self.read:
            self.read = True
        if name.split(".")[-1] in ("apply_", "map_", "map2_") and inputs:  # written in C++, not by aten
            self._seen_writes([], inputs[:1])
        if name in _CONVERSIONS:
            self.converted += sum(t.numel() for t in mine)
            for t in inputs:  # what is written through numpy or a pointer is out of the watch's sight
                self._hold(t, self._made, keep=False)
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
            numbers = [t for t in outputs if t.is_floating_point() or t.is_complex()]
            note = _judge(rule, func, inputs, numbers)
            if note is not None:
                self.note = note
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
        """The note for a call that returned ``value``: what was seen, or that the inputs were never read
        (or the result was made from none of them) through torch."""
        forbidden, rule, calls = self._given
        reached = (
            (tuple(self.forbidden), self.rule) != (forbidden, rule)
            or self.calls is not calls
            or len(calls) < self._count
            or (self._below is not None and getattr(self._below, "watch", None) is not self)
            or "_reached" in vars(self)
        )
        if reached:
            self.review = "changed the rules' watch while it ran (its rule, forbidden names or records)"
        if reached and (rule is not None or self._shapes):  # its inputs were watched (lesson 11)
            return "opaque", "it changed the watch that checks the rule while it ran"
        if rule is None:
            return None
        found = self.off or note_of(value) or self.note
        if found is None and not self.read:
            found = (
                "unseen",
                "its result was computed without the watch seeing its inputs being read "
                "(e.g. after turning them into plain tensors)",
            )
        shapes = {tuple(t.shape) for t in all_tensors(value)}  # a number may be a constant made before
        mixed = [(op, shape) for op, shape in self.mixed if math.prod(shape) > 1 or shape in shapes]
        with contextlib.suppress(Exception):
            self._written_unseen(all_tensors(value))
        written = [tuple(t.shape) for t in all_tensors(value) if self._key(t) in self._dirty]
        if found is None and mixed:
            self.review = (
                f"combined values of its inputs (`{mixed[0][0]}`) with a tensor of shape {mixed[0][1]} made "
                "where the watch could not see it (before the call, another thread, numpy, or the dispatcher's watch "
                "switched off)"
            )
        elif found is None and written:
            self.review = f"returned a tensor of shape {written[0]} written where the watch could not see it (another thread)"
        elif found is None and not any(self._holds(t) for t in all_tensors(value)):
            if not self.converted:
                return (
                    "unseen",
                    "its result was not computed from its inputs by any torch operation the watch saw",
                )
            self.review = (  # blocks read into Python one at a time (honest), or glued back there (not)
                "computed its result outside torch from values of its inputs taken out (numpy, lists, "
                "numbers), where the watch cannot tell whether they were read one block at a time"
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
