"""Keeping the lessons quick: PyTorch's FlopCounterMode and 'meta' device without compiler imports.

Lesson 09 counts multiply-adds with ``torch.utils.flop_counter.FlopCounterMode``. Its first use
imports ``torch._dynamo`` (about a second), only to mark the counter's dispatch function as one
the compiler must not trace. Until ``torch._dynamo`` has been imported nothing can be compiling, so
that mark changes nothing; :func:`count_flops_without_compiler_imports` lets the counter skip it
until then, and from then on marks it exactly as PyTorch does. The counts are the same.
:func:`meta_without_compiler_imports` does the same for the Python references that run many
operations on the 'meta' device (``torch._prims_common.wrappers``), which the device checks use.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def _until_compiler_loaded(raw: Callable[..., Any], recursive: bool = True) -> Callable[..., Any]:
    """raw, run as it is while torch._dynamo is not imported; then torch._dynamo.disable(raw), as torch does."""

    def call(*args: Any, **kwargs: Any) -> Any:
        dynamo = sys.modules.get("torch._dynamo")
        disable = getattr(dynamo, "disable", None)
        if disable is None:  # no compiler loaded: nothing can trace this call
            return raw(*args, **kwargs)
        real = disable(raw, recursive, wrapping=False)
        setattr(raw, "__dynamo_disable", real)  # what torch._disable_dynamo caches on its first call
        return real(*args, **kwargs)

    return call


def count_flops_without_compiler_imports() -> bool:
    """Let FlopCounterMode run without importing torch._dynamo first; True if it applied (safe to repeat)."""
    try:
        from torch.utils.flop_counter import _FlopCounterMode
    except ImportError:  # an older or newer torch: it keeps its own behaviour
        return False
    dispatch = _FlopCounterMode.__dict__.get("__torch_dispatch__")
    raw = getattr(dispatch, "__wrapped__", None)  # torch._disable_dynamo wraps it with functools.wraps
    if raw is None or not callable(raw):
        return False
    if getattr(raw, "__dynamo_disable", None) is None:
        setattr(raw, "__dynamo_disable", _until_compiler_loaded(raw))
    return True


_META_DONE = False


def meta_without_compiler_imports() -> int:
    """Let every function PyTorch has marked with ``torch._disable_dynamo`` so far (the Python references
    behind many operations on 'meta': masked_fill, division by a number, ...) run without importing
    torch._dynamo first, as above; the number it applied to (0 the second time: safe to repeat)."""
    global _META_DONE
    if _META_DONE:
        return 0
    _META_DONE = True
    import gc
    import types

    import torch

    mark = getattr(torch, "_disable_dynamo", None)
    code = getattr(mark(lambda: None), "__code__", None) if callable(mark) else None
    if code is None or code.co_freevars != ("fn", "recursive"):  # another torch: it keeps its own behaviour
        return 0
    done = 0
    for f in gc.get_objects():
        if type(f) is types.FunctionType and f.__code__ is code and f.__closure__:
            raw, recursive = (cell.cell_contents for cell in f.__closure__)
            if callable(raw) and getattr(raw, "__dynamo_disable", None) is None:
                setattr(raw, "__dynamo_disable", _until_compiler_loaded(raw, bool(recursive)))
                done += 1
    return done
