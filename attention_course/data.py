"""Load the course's small datasets from ``data/`` (the one source of truth).

Tensors come back as float32 on the CPU; move them with ``.to(device)``.
The folder is found next to this package (a clone, the student bundle, Colab),
or wherever the environment variable ``ATTENTION_COURSE_DATA`` points.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch


def data_dir() -> Path:
    """The folder holding the course's JSON datasets."""
    env = os.environ.get("ATTENTION_COURSE_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parent.parent / "data")
    for folder in candidates:
        if (folder / "love_cats.json").is_file():
            return folder
    raise FileNotFoundError(
        "Could not find the course's data/ folder (looked in: "
        + ", ".join(str(c) for c in candidates)
        + "). Set ATTENTION_COURSE_DATA to the folder that holds love_cats.json."
    )


@cache
def _read(name: str) -> dict:
    return json.loads((data_dir() / f"{name}.json").read_text())


@dataclass(frozen=True)
class Example:
    """Tokens with their input rows and the three projection matrices.

    Shapes: X (T, d_model), W_q and W_k (d_model, d_k), W_v (d_model, d_v).
    """

    tokens: list[str]
    X: torch.Tensor
    W_q: torch.Tensor
    W_k: torch.Tensor
    W_v: torch.Tensor
    features: list[str] | None = None


def _tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def love_cats() -> Example:
    """ "I love cats": 3 tokens, d_model = 4, d_k = d_v = 3."""
    d = _read("love_cats")
    return Example(d["tokens"], _tensor(d["X"]), _tensor(d["W_q"]), _tensor(d["W_k"]), _tensor(d["W_v"]))


def cat_sat() -> Example:
    """ "The cat sat on the": 5 tokens x 4 features (thing, action, small word, first token)."""
    d = _read("cat_sat")
    return Example(
        d["tokens"],
        _tensor(d["X"]),
        _tensor(d["W_q"]),
        _tensor(d["W_k"]),
        _tensor(d["W_v"]),
        features=d["features"],
    )


def milk() -> Example:
    """ "i poured milk into the cup": 6 tokens, D = 6, random (seed 0). X is the embedding E."""
    d = _read("milk")
    return Example(d["tokens"], _tensor(d["E"]), _tensor(d["W_q"]), _tensor(d["W_k"]), _tensor(d["W_v"]))


@dataclass(frozen=True)
class Source:
    """A source sentence for cross-attention: its tokens, the token of the target each one translates,
    and its encoder rows. Shapes: X (T_enc, d_model)."""

    tokens: list[str]
    translates: list[str]
    X: torch.Tensor


def milk_source(length: float = 4.0) -> Source:
    """私はカップに牛乳を注いだ, the Japanese of "i poured milk into the cup", as 4 encoder rows (d_model = 6).

    Built, not drawn: the key of each source token (its row times the milk example's W_k) points along the
    query of the English token it translates (``translates``), with the given length, so that this query
    scores it above every other source token. X = K_goal W_k^-1, computed in float64.
    """
    m = milk()
    tokens = ["watashi-wa", "kappu-ni", "gyuunyuu-o", "sosoida"]
    translates = ["i", "cup", "milk", "poured"]
    Q = m.X.double() @ m.W_q.double()  # (6, d_k): the English queries
    goal = torch.stack([Q[m.tokens.index(t)] for t in translates])  # (4, d_k)
    goal = length * goal / goal.norm(dim=-1, keepdim=True)
    X = goal @ torch.linalg.inv(m.W_k.double())  # (4, d_model): rows whose keys are the goal
    return Source(tokens, translates, X.float())


@dataclass(frozen=True)
class SoftDictionary:
    """Keys are directions, values are (red, green) amounts; plain Python lists."""

    keys: dict[str, list[float]]
    values: dict[str, list[float]]
    query: list[float]
    sharpness: list[float]


def colours() -> SoftDictionary:
    """The soft dictionary of colours (red, green, orange)."""
    d = _read("colours")
    return SoftDictionary(
        keys={k: [float(x) for x in v] for k, v in d["keys"].items()},
        values={k: [float(x) for x in v] for k, v in d["values"].items()},
        query=[float(x) for x in d["query"]],
        sharpness=[float(s) for s in d["sharpness"]],
    )
