"""Interactive explorers: sliders and clickable matrices driven by your own functions.

Put one as the last line of a cell::

    from attention_course.explorers import head_dimension_explorer
    head_dimension_explorer(scaled_scores=scaled_scores)

Pass the functions you wrote in the lesson. While one is still a stub, raises, or
returns a shape the lesson rules out, the explorer says so (naming both shapes) and
shows the course's built-in version instead, clearly labelled. Each
explorer also leaves a picture of its starting setting and its readout in the saved
notebook, readable without a widget front end (GitHub, nbviewer, HTML exports).
While a notebook is being graded (``NBGRADER_EXECUTION`` set) explorers do nothing.

Importing this package draws nothing and imports neither Matplotlib nor ipywidgets.

Where each explorer lives (its computation, figure and widget in one module):
``head_dimension``, ``sharpness``, ``stepper`` (stage stepper), ``explainer`` (row
follower and cell explainer), ``masks`` (mask explorer), ``pipeline`` (pipeline view).
What they share: ``choosing`` (the student's function or the built-in one), ``compare``
(where what is shown departs from the lesson's arithmetic, in words), ``stages``
(one head in stages, each cell's arithmetic in words), ``base`` (``Explorer``,
``Skipped``), ``drawing`` (figures redrawn in place, PNG bytes, font sizes) and
``numeric`` (number formatting, entropy).
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = [
    "head_dimension_explorer",
    "sharpness_explorer",
    "stage_stepper",
    "cell_explainer",
    "row_follower",
    "mask_explorer",
    "pipeline_view",
]


_STEPS = ("project", "scores", "scaled_scores", "causal_mask", "apply_mask", "softmax", "mix", "attention")


def _steps(arguments: dict) -> dict:
    """The head's step functions among an explorer's arguments, by name (None where not given)."""
    return {name: arguments[name] for name in _STEPS}


def _grading() -> bool:
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def head_dimension_explorer(
    scaled_scores: Callable | None = None,
    softmax: Callable | None = None,
    score_spread: Callable | None = None,
    *,
    d_k: int = 64,
    scale: bool = False,
    seed: int | None = None,
    row: int | None = None,
):
    """Lesson 03: a d_k slider (1 to 128), a 1/sqrt(d_k) toggle and a resample button.

    Shows the spread of raw and scaled scores of random unit-variance queries and
    keys, the softmax weights (all rows, and one row as bars) and their entropy, next
    to the average entropy for every d_k. ``scaled_scores(Q, K)`` and
    ``softmax(Z, dim)`` run the computation; ``score_spread`` adds its numbers.
    ``seed`` and ``row`` pick the sample and the followed query row (the defaults
    saturate at d_k = 64 unscaled).
    """
    from .base import Skipped
    from .head_dimension import HeadDimensionExplorer

    if _grading():
        return Skipped(HeadDimensionExplorer.title)
    from .choosing import one_thread
    from .head_dimension import HEAD_ROW, HEAD_SEED

    with one_thread():
        return HeadDimensionExplorer(
            scaled_scores,
            softmax,
            score_spread,
            d_k=d_k,
            scale=scale,
            seed=HEAD_SEED if seed is None else seed,
            row=HEAD_ROW if row is None else row,
        )


def sharpness_explorer(soft_lookup: Callable | None = None, *, sharpness: float = 1.0):
    """Lesson 05: a sharpness slider on the colour soft dictionary.

    Shows the three weights as bars, the blended colour as a swatch, each weight
    against sharpness and the vectors in the plane. Query and keys are editable and
    the follow-up questions are one click each. ``soft_lookup(query, keys, values,
    sharpness) -> (weights, output)`` does the look-up.
    """
    from .base import Skipped
    from .choosing import one_thread
    from .sharpness import SharpnessExplorer

    if _grading():
        return Skipped(SharpnessExplorer.title)
    with one_thread():
        return SharpnessExplorer(soft_lookup, sharpness=sharpness)


def stage_stepper(
    attention: Callable | None = None,
    *,
    example: str = "love_cats",
    causal: bool | None = None,
    stage: int = 1,
    query: int | None = None,
    project: Callable | None = None,
    scores: Callable | None = None,
    scaled_scores: Callable | None = None,
    causal_mask: Callable | None = None,
    apply_mask: Callable | None = None,
    softmax: Callable | None = None,
    mix: Callable | None = None,
):
    """Lesson 07 (and earlier): step 1 raw dot products, 2 scaled, (masked,) weights, output.

    A query chooser picks the row that is followed through the stages. ``example``
    is "love_cats" (no mask) or "cat_sat" (causal mask). Every function you pass is
    used where it runs; ``attention(Q, K, V, mask) -> (O, A)`` supplies A and O.
    """
    from .base import Skipped
    from .choosing import one_thread
    from .stepper import StageStepper

    if _grading():
        return Skipped(StageStepper.title)
    functions = _steps(locals())
    with one_thread():
        return StageStepper(example=example, causal=causal, stage=stage, query=query, **functions)


def cell_explainer(
    *,
    example: str = "cat_sat",
    causal: bool | None = None,
    follow: int | None = None,
    project: Callable | None = None,
    scores: Callable | None = None,
    scaled_scores: Callable | None = None,
    causal_mask: Callable | None = None,
    apply_mask: Callable | None = None,
    softmax: Callable | None = None,
    mix: Callable | None = None,
    attention: Callable | None = None,
):
    """Row follower and cell explainer: every cell of Q, K, V, S, A and O is a button.

    Point at a cell to see the arithmetic that made it (q_i . k_j term by term,
    / sqrt(d_k), the mask, exp(x - max), / row sum, the weighted sum of value rows);
    click it to keep the explanation and see which cells fed it. Choose a token to
    follow its row through every matrix. Default example: "The cat sat on the".
    """
    from .base import Skipped
    from .choosing import one_thread
    from .explainer import CellExplainer

    if _grading():
        return Skipped(CellExplainer.title)
    functions = _steps(locals())
    with one_thread():
        return CellExplainer(example=example, causal=causal, follow=follow, **functions)


row_follower = cell_explainer


def mask_explorer(
    causal_mask: Callable | None = None,
    padding_mask: Callable | None = None,
    apply_mask: Callable | None = None,
    *,
    T: int = 5,
    lengths: tuple[int, ...] = (5, 3, 2),
):
    """Lesson 04: the causal mask, a padded batch whose lengths you drag, and the scores each mask hides.

    Shows the causal mask (T x T), each sequence's padding mask and its scaled scores
    after the combined mask (causal AND padding), hidden cells as -inf, with a readout
    in words. ``causal_mask(T)``, ``padding_mask(lengths, T)`` and ``apply_mask(S, allowed)``
    are used where they run. ``lengths``: one to four sequences of "The cat sat on the".
    """
    from .base import Skipped

    if _grading():
        return Skipped("Mask explorer")
    from .choosing import one_thread
    from .masks import MaskExplorer

    with one_thread():
        return MaskExplorer(
            T=T, lengths=lengths, causal_mask=causal_mask, padding_mask=padding_mask, apply_mask=apply_mask
        )


def pipeline_view(
    attention: Callable | None = None,
    *,
    example: str = "cat_sat",
    causal: bool | None = None,
    query: int | None = None,
    project: Callable | None = None,
    scores: Callable | None = None,
    scaled_scores: Callable | None = None,
    causal_mask: Callable | None = None,
    apply_mask: Callable | None = None,
    softmax: Callable | None = None,
    mix: Callable | None = None,
):
    """Lesson 07: the whole head for one query, X to O; click a cell to see where it came from.

    Every cell of X, Q, K, V and of the query's row of scores, scaled scores, masked
    scores, weights and output is a button: clicking it (or Enter on it) shows its
    arithmetic and lights up the cells that feed it directly ("earlier sources" lights
    the ones before those too). ``query``: the row followed; by default one whose keys
    the mask partly hides.
    """
    from .base import Skipped

    if _grading():
        return Skipped("Pipeline view")
    from .choosing import one_thread
    from .pipeline import PipelineView

    functions = _steps(locals())
    with one_thread():
        return PipelineView(example=example, causal=causal, query=query, **functions)
