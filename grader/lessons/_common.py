"""Small builders every lesson's seeded cases share: sizes, seeded draws and case labels.

Sizes are all different on purpose, so that T_q, T_k, d_model, d_k, d_v, batch and heads
can't be confused: a function that mixes two of them up gets a wrong shape or an error,
never a lucky pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from grader.harness import Trap

# T_q, T_k, d_model, d_k, d_v, batch, heads
TQ, TK, DM, DK, DV, B, H = 5, 7, 9, 8, 4, 2, 3
NEG_INF = float("-inf")


# Added to every case's seed while a submission is graded (``salted``): the hidden inputs then
# differ per course and per submission, so what one attempt's feedback shows is of no use to the
# next. 0 (the lesson's own seeds) everywhere else: tests, the docs, ``grader.check`` by hand.
_SALT = [0]


def gen(seed: int) -> torch.Generator:
    """A CPU generator in a known state: the lesson's seed, or while salted a seed drawn from the salt
    and the lesson's seed together. PyTorch's CPU generator keeps 32 bits of a seed, so each case gets
    a seed of its own: one case's inputs, recovered from a leaked number, tell nothing of the others."""
    if not _SALT[0]:
        return torch.Generator().manual_seed(seed)
    drawn = hashlib.sha256(f"{_SALT[0]}:{seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(drawn[:8], "big") >> 1)


@contextmanager
def salted(salt: int) -> Iterator[None]:
    """Every seeded case built inside draws from seeds shifted by ``salt``."""
    before, _SALT[0] = _SALT[0], int(salt) % 2**62
    try:
        yield
    finally:
        _SALT[0] = before


def integer(g: torch.Generator, low: int, high: int) -> int:
    """An integer drawn from low .. high (both included) with ``g`` (from ``gen``: salted while graded)."""
    return int(torch.randint(low, high + 1, (), generator=g))


def uniform(g: torch.Generator, low: float, high: float) -> float:
    """A float drawn uniformly from [low, high) with ``g`` (from ``gen``: salted while graded)."""
    return low + (high - low) * float(torch.rand((), generator=g, dtype=torch.float64))


def shuffled(g: torch.Generator, items: list) -> list:
    """The items in an order drawn with ``g``."""
    return [items[i] for i in torch.randperm(len(items), generator=g).tolist()]


def randn(*shape: int, seed: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded standard normal draw, made on the CPU then moved (same numbers everywhere)."""
    return torch.randn(*shape, generator=gen(seed), dtype=torch.float64).to(device, dtype)


def batches() -> list[tuple[str, tuple[int, ...]]]:
    """The leading dimensions every tensor exercise is checked with: none, (batch,), (batch, heads)."""
    return [("2-D", ()), ("batched 3-D", (B,)), ("batched 4-D (batch, heads)", (B, H))]


def label(kind: str, dtype: torch.dtype, device: torch.device) -> str:
    """A case's label, e.g. ``2-D, float32 on cpu``."""
    return f"{kind}, {str(dtype).replace('torch.', '')} on {device.type}"


def dtypes(batch: tuple[int, ...]) -> list[torch.dtype]:
    """float32 for every batch shape, float64 too except for the 3-D one."""
    return [torch.float32] if batch == (B,) else [torch.float32, torch.float64]


def same_mistake(name: str, hint: str, *ways: tuple[Callable[..., Any], str]) -> list[Trap]:
    """One mistake made several ways: a Trap per ``(fn, example)``, all with the same name and hint."""
    return [Trap(name, hint, fn, example=example) for fn, example in ways]
