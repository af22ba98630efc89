"""Regenerate data/milk.json, the random "i poured milk into the cup" example.

    python data/make_milk.py

rng = numpy.random.default_rng(0); E = normal(0, 1, (6, 6)); then W_q, W_k, W_v =
normal(0, 0.5, (6, 6)), drawn in that order. tests/test_data.py checks that the
stored numbers are exactly these draws.
"""

import json
from pathlib import Path

import numpy as np


def draw() -> dict:
    rng = np.random.default_rng(0)
    E = rng.normal(0, 1, (6, 6))
    W_q = rng.normal(0, 0.5, (6, 6))
    W_k = rng.normal(0, 0.5, (6, 6))
    W_v = rng.normal(0, 0.5, (6, 6))
    return {
        "description": '"i poured milk into the cup": 6 tokens, D = 6, random. '
        "rng = numpy.random.default_rng(0); E = normal(0, 1, (6, 6)); "
        "W_q, W_k, W_v = normal(0, 0.5, (6, 6)) in that order.",
        "tokens": ["i", "poured", "milk", "into", "the", "cup"],
        "E": E.tolist(),
        "W_q": W_q.tolist(),
        "W_k": W_k.tolist(),
        "W_v": W_v.tolist(),
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("milk.json")
    out.write_text(json.dumps(draw(), indent=1) + "\n")
    print(f"wrote {out}")
