"""How values cross the pipes between the trusted side and the sandbox: one framed message at a time, by
its deadline (``send``, ``receive``); a student's value as plain data (``plain``); a message's bytes (``dump``,
``load``). A runtime module: mounted in the seal with the sandbox, it imports nothing of the grading package.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import pickle
import select
import struct
import time
from typing import Any

MAX_MESSAGE = 256 << 20  # bytes: a bigger answer is refused by the trusted side

# the built-ins bound now, as in the sandbox: a student who patches ``builtins`` later must not be able
# to change how the answers are made
isinstance = builtins.isinstance  # noqa: A001
type = builtins.type  # noqa: A001
hasattr = builtins.hasattr  # noqa: A001
getattr = builtins.getattr  # noqa: A001

# ------------------------------------------------------------------ framing


def send(fd: int, payload: bytes, deadline: float | None = None) -> None:
    """One message; with ``deadline`` (``fd`` non-blocking), all of it taken by then, or ``TimeoutError``."""
    view = memoryview(struct.pack("<Q", len(payload)) + payload)
    while view:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([], [fd], [], left)[1]):
            raise TimeoutError("the other side did not take its message in time")
        with contextlib.suppress(BlockingIOError):
            view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int, deadline: float | None = None) -> bytes:
    chunks = []
    while n:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and (left <= 0 or not select.select([fd], [], [], left)[0]):
            raise TimeoutError("the other side did not finish its message in time")
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, limit: int = MAX_MESSAGE, deadline: float | None = None) -> bytes:
    """One message; by ``deadline`` (``time.monotonic()``), all of it, or ``TimeoutError``."""
    (n,) = struct.unpack("<Q", _read_exact(fd, 8, deadline))
    if n > limit:
        raise ValueError(f"message of {n} bytes is over the limit of {limit}")
    return _read_exact(fd, n, deadline)


# ------------------------------------------------------------------ values


def plain(x: Any, depth: int = 0) -> Any:
    """A copy of x made only of what ``torch.load(weights_only=True)`` accepts.

    Anything else becomes ``{"__opaque__": type name}`` so that the checks can
    still say what the student returned.
    """
    import torch

    if depth > 32:
        return {"__opaque__": "deeply nested value"}
    if isinstance(x, torch.Tensor):
        t = x.detach()
        return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, (torch.dtype, torch.device)):
        return x
    if isinstance(x, torch.Size):
        return tuple(int(v) for v in x)
    for kind in (int, float, str):  # subclasses (numpy.float64, an IntEnum) as the plain type
        if isinstance(x, kind):
            return kind(x)
    if type(x).__module__ == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        return plain(x.item(), depth + 1)
    if isinstance(x, tuple):
        return tuple(plain(v, depth + 1) for v in x)
    if isinstance(x, list):
        return [plain(v, depth + 1) for v in x]
    if isinstance(x, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in x.items()}
    return {"__opaque__": type(x).__name__}


# Tensors cross the pipes as their bytes, in a tree of JSON (pickle and torch.save took 0.5 to 1 ms a message,
# and a training loop that calls the reference once per sequence makes 50,000 calls); ``load`` builds only
# data from it. What does not fit goes as before: torch.save's format from the sandbox, read with weights_only.
WIRE = b"ACW1"
# the dtypes that cross as bytes (a quantized tensor made from bytes crashed the process that read it)
DTYPES = frozenset(
    "bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 complex64 complex128".split()
)


class _Unfit(Exception):
    pass


def _tree(x: Any, blobs: list, seen: dict, copy: bool) -> Any:
    import torch

    if x is None or type(x) in (bool, int, float, str):
        return x
    if type(x) in (tuple, list, dict):
        parts = [y for kv in x.items() for y in kv] if type(x) is dict else x
        return [{tuple: "t", list: "l", dict: "d"}[type(x)]] + [_tree(v, blobs, seen, copy) for v in parts]
    if isinstance(x, (torch.dtype, torch.device)):
        return ["D" if isinstance(x, torch.dtype) else "V", str(x).removeprefix("torch.")]
    if (
        type(x) is not torch.Tensor
        or x.layout != torch.strided
        or x.is_nested
        or str(x.dtype)[6:] not in DTYPES
    ):
        raise _Unfit
    if id(x) not in seen:  # without ``copy``, only a tensor that owns all of its storage, as pickle keeps it
        whole = x.is_contiguous() and not (x.storage_offset() or x.is_conj() or x.is_neg() or x.grad_fn)
        if not (copy or whole and x.untyped_storage().nbytes() == x.numel() * x.element_size()):
            raise _Unfit
        try:  # its values in C order
            blobs.append(b"" if x.is_meta or not x.numel() else x.numpy(force=True).tobytes())
        except TypeError:  # a dtype numpy lacks (bfloat16): as bytes
            flat = x.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
            blobs.append(flat.view(torch.uint8).numpy().tobytes())
        head = [len(seen), str(x.dtype)[6:], list(x.shape), str(x.device), x.requires_grad]
        seen[id(x)] = [*head, len(blobs[-1])]
    return ["T", *seen[id(x)]]


def dump(obj: Any, copy: bool = True) -> bytes:
    """obj as it crosses a pipe; ``copy``: from the sandbox (a value of ``plain``), else from the trusted side."""
    blobs: list = []
    try:
        doc = json.dumps(_tree(obj, blobs, {}, copy)).encode()
    except Exception:  # noqa: BLE001 - what the wire cannot carry (_Unfit, a named tensor, ...) goes as before
        if not copy:
            return pickle.dumps(obj)
        import torch

        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()
    return b"".join([WIRE, struct.pack("<Q", len(doc)), doc, *blobs])


def load(payload: bytes, trusted: bool = False) -> Any:
    """What ``dump`` made, from bytes that may be anything (``trusted``: the trusted side's)."""
    import torch

    if payload[:4] != WIRE:
        return pickle.loads(payload) if trusted else torch.load(io.BytesIO(payload), weights_only=True)
    (n,) = struct.unpack("<Q", payload[4:12])
    state: list = [memoryview(payload), 12 + n, []]
    value = _value(json.loads(payload[12 : 12 + n]), state, 0)
    if state[1] != len(payload):
        raise ValueError("bytes after the last tensor")
    return value


def _key(k: Any) -> bool:
    """A dict key whose hash no one chooses: a string's is salted, an int's below 2**61 - 1 is itself."""
    if type(k) is tuple:
        return all(_key(v) for v in k)
    return k is None or type(k) in (str, bool) or type(k) is int and abs(k) < (1 << 61) - 1


def _value(x: Any, state: list, depth: int) -> Any:
    import torch

    if not isinstance(x, list) or depth > 64:
        if isinstance(x, (list, dict)):
            raise ValueError("not a value")
        return x
    tag, rest = (x[0], x[1:]) if x else (None, [])
    if tag in ("t", "l", "d"):
        items = [_value(v, state, depth + 1) for v in rest]
        if tag == "d" and not all(_key(k) for k in items[::2]):
            raise ValueError("a key whose hash can be chosen")  # 20,000 of one hash: seconds to read
        return tuple(items) if tag == "t" else items if tag == "l" else dict(zip(items[::2], items[1::2]))
    if tag in ("D", "V") and len(rest) == 1 and isinstance(rest[0], str):
        kind = vars(torch).get(rest[0])
        if tag == "V" or isinstance(kind, torch.dtype):
            return torch.device(rest[0]) if tag == "V" else kind
    if tag == "T" and len(rest) == 6 and type(rest[0]) is int and 0 <= rest[0] < len(state[2]):
        return state[2][rest[0]]
    if tag == "T" and len(rest) == 6 and rest[0] == len(state[2]) and isinstance(rest[1], str):
        _, dtype, shape, device, grad, size = rest
        kind, at = vars(torch).get(dtype) if dtype in DTYPES else None, state[1]
        ok = isinstance(kind, torch.dtype) and isinstance(shape, list) and len(shape) <= 64
        ok = ok and all(type(d) is int and d >= 0 for d in shape) and type(size) is int
        if not (ok and size == (0 if device == "meta" else math.prod(shape) * kind.itemsize)):
            raise ValueError("a tensor's bytes do not fit its shape")
        if at + size > len(state[0]):
            raise ValueError("a tensor's bytes are missing")
        t = torch.frombuffer(bytearray(state[0][at : at + size]), dtype=kind) if size else None
        t = t.reshape(shape) if size else torch.empty(shape, dtype=kind, device=str(device))
        state[1], t = at + size, t if not size or device == "cpu" else t.to(torch.device(str(device)))
        state[2].append(t.requires_grad_() if grad is True else t)
        return t
    raise ValueError("not a value")


def tensors(x: Any) -> list:
    """Every tensor in a value made of tuples, lists and dicts, in a fixed order (both sides agree on it)."""
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    return []


def with_tensors(x: Any, new: Any) -> Any:
    """x with its tensors replaced, in the order of ``tensors(x)``, by those ``new`` (an iterator) yields."""
    import torch

    if isinstance(x, torch.Tensor):
        return next(new)
    if isinstance(x, tuple):
        return tuple(with_tensors(v, new) for v in x)
    if isinstance(x, list):
        return [with_tensors(v, new) for v in x]
    if isinstance(x, dict):
        return {k: with_tensors(v, new) for k, v in x.items()}
    return x
