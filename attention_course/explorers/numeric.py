"""Numbers as the explorers print them, and the entropy of attention weights (no widgets, no plots)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

# ------------------------------------------------------------------ formatting


def fmt(x: float, dp: int = 2) -> str:
    """A number as the lessons write it: -inf, whole numbers without decimals, else ``dp`` places."""
    x = float(x)
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if math.isnan(x):
        return "nan"
    if abs(x) >= 1e6:  # e.g. -1e+09 for a "blocked" score written as a big negative number
        return f"{x:.3g}"
    if abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    text = f"{x:.{dp}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def fmt_list(xs: Sequence[float], dp: int = 2) -> str:
    return "[" + ", ".join(fmt(x, dp) for x in xs) + "]"


# --------------------------------------------------------------------- entropy


def entropy(weights: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy (in nats) of each distribution along ``dim``; 0 log 0 counts as 0.

    Shapes: weights (..., n) -> (...). A one-hot row gives 0, a uniform row over n keys ln(n).
    """
    w = weights.detach().to(torch.float64)
    logs = torch.where(w > 0, torch.log(w.clamp_min(1e-300)), torch.zeros_like(w))
    return (-(w * logs).sum(dim=dim)).clamp_min(0.0)
