"""Seeded tensors and comparison tolerances the reference and lesson tests share."""

from __future__ import annotations

import torch

DTYPES = [torch.float32, torch.float64]

# The course brief's weights and output for "I love cats" (lessons 06 and 07), to two places.
BRIEF_A = [[0.14, 0.43, 0.43], [0.00, 0.91, 0.09], [0.01, 0.75, 0.24]]
BRIEF_O = [[1.86, 6.32, 1.70], [2.00, 7.81, 0.27], [1.99, 7.48, 0.74]]

# the colour dictionary of lesson 05: (sharpness, weights of red, green and orange, blended colour)
BRIEF_COLOURS = [
    (1, (0.41, 0.22, 0.37), (200, 117)),
    (5, (0.61, 0.03, 0.37), (249, 67)),
    (25, (0.92, 0.00, 0.08), (255, 13)),
]


def rounded(rows: list[list[float]], places: int = 2) -> list[list[float]]:
    """A matrix's numbers rounded to ``places``, to compare with the brief's printed ones."""
    return [[round(x, places) for x in row] for row in rows]


def draw(
    *shape: int, seed: int, device: str | torch.device, dtype: torch.dtype = torch.float32, scale: float = 1.0
) -> torch.Tensor:
    """A seeded standard normal draw times ``scale``, made on the CPU then moved (same numbers everywhere)."""
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale).to(
        device
    )


def tol(dtype: torch.dtype, float32_atol: float = 1e-5) -> dict[str, float]:
    """``torch.testing.assert_close`` tolerances for results computed in ``dtype``."""
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": float32_atol}
    return {"rtol": 1e-10, "atol": 1e-12}
