"""How long one control event of each explorer takes, next to a naive ``interact``.

    python benchmarks/explorers.py            # every explorer, default number of events
    python benchmarks/explorers.py --events 60 --naive-events 12

For each explorer the script drives its controls from code (slider values, toggles,
clicks), timing each event from the control change to the new picture (computation,
figure update, PNG, widget state), and prints the median and 90th percentile. In the
same run it times a naive version: ``ipywidgets.interactive`` over the same controls
whose function recomputes and re-plots the whole figure with pyplot, shown through
Matplotlib's inline backend (the usual ``interact`` + ``plt.show()`` cell).

Target: median 25 ms or less per event, and at most half the naive median.
Exit status 1 when a target is missed (``--no-fail`` to only report).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.pop("NBGRADER_EXECUTION", None)

TARGET_MS = 25.0
TARGET_RATIO = 0.5


def inline_shell():
    """An IPython shell with Matplotlib's inline backend; displays are formatted, then dropped."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None  # no event loop in a script; inline needs none
    shell.enable_matplotlib("inline")
    shell.display_pub.publish = lambda *args, **kwargs: None
    shell.display_pub.clear_output = lambda *args, **kwargs: None
    return shell


def timed(events, warmup: int = 3) -> tuple[list[float], list[float]]:
    """Run each event (a no-argument callable); wall and CPU milliseconds of all but the warm-up ones.

    What the events print goes to a buffer, as a kernel would send it away. CPU time
    (this process, all threads) is what the work costs; wall time is what a student
    waits, and grows when other programs share the CPUs.
    """
    wall, cpu = [], []
    with contextlib.redirect_stdout(io.StringIO()):
        for n, event in enumerate(events):
            start, start_cpu = time.perf_counter(), time.process_time()
            event()
            if n >= warmup:
                wall.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - start_cpu) * 1000)
    return wall, cpu


def cycle(values, n):
    values = list(values)
    return [values[k % len(values)] for k in range(n)]


def setter(widget, value):
    return lambda: setattr(widget, "value", value)


# ----------------------------------------------------------------- naive plots


def naive_head(d_k, scale, row, seed):
    import math

    import matplotlib.pyplot as plt
    import numpy as np

    from attention_course.explorers import compute as C

    Q, K = C.draw_head_vectors(seed)
    v = C.head_view(Q, K, d_k, scale, row=row, seed=seed)
    unscaled, scaled = NAIVE_CURVES
    fig, axes = plt.subplots(2, 2, figsize=(8.6, 5.4), dpi=80)
    a, b, c, d = axes.flat
    a.scatter(v.raw.flatten(), np.ones(v.raw.numel()), s=10, label="raw")
    a.scatter(v.scaled.flatten(), np.zeros(v.raw.numel()), s=10, label="scaled")
    a.set_xlim(-42, 42)
    a.set_title(f"raw std {v.raw_std:.2f}, scaled std {v.scaled_std:.2f}")
    a.set_xlabel("score")
    im = b.imshow(v.weights, cmap="cividis", vmin=0, vmax=1)
    b.set_xticks(range(8), C.HEAD_TOKENS, rotation=45)
    b.set_yticks(range(8), C.HEAD_TOKENS)
    fig.colorbar(im, ax=b)
    c.bar(C.HEAD_TOKENS, v.row_weights)
    c.set_ylim(0, 1.1)
    c.set_title(f"entropy {v.row_entropy:.2f} nats")
    d.plot(C.CURVE_D_K, unscaled, "--", label="not scaled")
    d.plot(C.CURVE_D_K, scaled, label="scaled")
    d.axhline(math.log(8), ls=":")
    d.plot([d_k], [v.row_entropy], "o")
    d.set_xscale("log", base=2)
    d.set_xlabel("d_k")
    d.legend()
    plt.show()
    print(v.summary())


def naive_sharpness(sharpness, qx, qy):
    import matplotlib.pyplot as plt

    from attention_course import data
    from attention_course.explorers import compute as C

    d = data.colours()
    v = C.colour_view([qx, qy], d.keys, d.values, sharpness)
    grid = [i * 0.5 for i in range(61)]
    curves = C.colour_curves([qx, qy], d.keys, d.values, grid)
    fig, axes = plt.subplots(2, 2, figsize=(8.6, 5.0), dpi=80)
    a, b, c, e = axes.flat
    a.bar(list(v.weights), list(v.weights.values()), color=["red", "green", "orange"])
    a.set_ylim(0, 1.1)
    b.add_patch(plt.Rectangle((0, 0), 1, 1, color=v.hex))
    b.set_title(f"[{v.rgb[0]}, {v.rgb[1]}]")
    b.axis("off")
    for name, ys in curves.items():
        c.plot(grid, ys, label=name)
    c.axvline(sharpness, color="black")
    c.legend()
    for name, k in v.keys.items():
        e.plot([0, k[0]], [0, k[1]], label=name)
    e.plot([0, qx], [0, qy], "k")
    e.set_aspect("equal")
    plt.show()
    print(v.summary())


def naive_stage(stage, query):
    import matplotlib.pyplot as plt

    from attention_course.explorers import compute as C

    st = NAIVE_STAGES
    s = st.stages()[stage - 1]
    M = s.matrix.numpy()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.6, 3.7), dpi=80)
    a.imshow(M, cmap="cividis")
    for i in range(M.shape[0]):
        for j in range(M.shape[1]):
            a.text(j, i, C.fmt(M[i, j]), ha="center", va="center", color="white")
    a.set_xticks(range(len(s.columns)), s.columns)
    a.set_yticks(range(st.T), st.tokens)
    a.set_title(s.formula)
    b.bar(s.columns, [x if abs(x) != float("inf") else 0 for x in M[query]])
    b.set_title(f"row {st.tokens[query]}")
    plt.show()
    print("\n".join(C.stage_row_lines(st, s, query)))


def naive_explainer(matrix, i, j, follow):
    import matplotlib.pyplot as plt

    from attention_course.explorers import compute as C
    from attention_course.explorers import figures

    st = NAIVE_CAT
    fig = figures.matrices_figure(st, follow)
    managed = plt.figure(figsize=(9.6, 5.6), dpi=80)  # what pyplot would hold; drawn as the full picture
    managed.figimage(_as_pixels(fig))
    plt.show()
    print("\n".join(C.explain_row(st, follow)))
    print(C.explain_cell(st, matrix, i, j).text)


def _as_pixels(fig):
    import numpy as np

    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())


# ---------------------------------------------------------------------- runs


def run_head(n_events, n_naive):
    import ipywidgets as W

    from attention_course.explorers import compute as C
    from attention_course.explorers import head_dimension_explorer

    ex = head_dimension_explorer()
    c = ex.controls
    d_values = cycle([1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 100, 70, 40, 20, 6, 3], n_events)
    events = []
    for k, d in enumerate(d_values):
        events.append(setter(c["d_k"], d))
        if k % 7 == 6:
            events.append(setter(c["scale"], not bool(k % 2)))
        if k % 11 == 10:
            events.append(lambda: c["resample"].click())
        if k % 13 == 12:
            events.append(setter(c["row"], k % 8))
    ours = timed(events)

    global NAIVE_CURVES
    NAIVE_CURVES = C.expected_entropy(C.CURVE_D_K)
    w = W.interactive(
        naive_head,
        d_k=W.IntSlider(64, 1, 128),
        scale=W.Checkbox(False),
        row=W.IntSlider(C.HEAD_ROW, 0, 7),
        seed=W.IntText(C.HEAD_SEED),
    )
    d_slider = w.children[0]
    naive = timed([setter(d_slider, d) for d in d_values[: n_naive + 3]])
    return ours, naive


def run_sharpness(n_events, n_naive):
    import ipywidgets as W

    from attention_course.explorers import sharpness_explorer

    ex = sharpness_explorer()
    c = ex.controls
    values = cycle([0.5 * k for k in range(0, 61, 3)] + [25, 5, 1], n_events)
    events = []
    for k, s in enumerate(values):
        events.append(setter(c["sharpness"], s))
        if k % 5 == 4:
            events.append(setter(c["query_x"], round(1.0 - 0.05 * (k % 9), 2)))
        if k % 9 == 8:
            events.append(lambda k=k: c["presets"][k % 4].click())
    ours = timed(events)
    w = W.interactive(
        naive_sharpness,
        sharpness=W.FloatSlider(1.0, min=0, max=30, step=0.5),
        qx=W.FloatSlider(1.0, min=-1.5, max=1.5),
        qy=W.FloatSlider(0.1, min=-1.5, max=1.5),
    )
    naive = timed([setter(w.children[0], s) for s in values[: n_naive + 3]])
    return ours, naive


def run_stage(n_events, n_naive):
    import ipywidgets as W

    from attention_course.explorers import compute as C
    from attention_course.explorers import stage_stepper

    ex = stage_stepper()
    c = ex.controls
    events = []
    for k in range(n_events):
        events.append(setter(c["stage"], 1 + k % 4))
        if k % 3 == 2:
            events.append(setter(c["query"], k % 3))
    ours = timed(events)
    global NAIVE_STAGES
    NAIVE_STAGES = C.example_stages("love_cats")
    w = W.interactive(naive_stage, stage=W.IntSlider(1, 1, 4), query=W.IntSlider(2, 0, 2))
    naive = timed([setter(w.children[0], 1 + k % 4) for k in range(1, n_naive + 4)])
    return ours, naive


def run_explainer(n_events, n_naive):
    import ipywidgets as W

    from attention_course.explorers import cell_explainer
    from attention_course.explorers import compute as C

    ex = cell_explainer()
    cells = list(ex.controls["cells"].items())
    events = []
    for k in range(n_events):
        key, button = cells[(7 * k) % len(cells)]
        events.append(button.click)
        if k % 6 == 5:
            events.append(setter(ex.controls["follow"], k % 5))
    ours = timed(events)
    global NAIVE_CAT
    NAIVE_CAT = C.example_stages("cat_sat")
    w = W.interactive(
        naive_explainer,
        matrix=W.Dropdown(options=list(C.MATRICES), value="A"),
        i=W.IntSlider(4, 0, 4),
        j=W.IntSlider(1, 0, 4),
        follow=W.IntSlider(4, 0, 4),
    )
    naive = timed([setter(w.children[2], k % 4) for k in range(1, n_naive + 4)])
    return ours, naive


RUNS = {
    "head dimension (03)": run_head,
    "sharpness (05)": run_sharpness,
    "stage stepper (07)": run_stage,
    "cell explainer (cat sat)": run_explainer,
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=40, help="events per explorer (default 40)")
    parser.add_argument("--naive-events", type=int, default=10, help="events per naive version (default 10)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a target is missed")
    parser.add_argument("--only", action="append", default=[], help="run only explorers whose name has this")
    args = parser.parse_args(argv)

    import ipywidgets
    import matplotlib

    inline_shell()
    print(
        f"ipywidgets {ipywidgets.__version__}, matplotlib {matplotlib.__version__}, {os.cpu_count()} CPUs; "
        f"target: median <= {TARGET_MS:.0f} ms and <= {TARGET_RATIO:.0%} of naive"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs (wall times grow when it exceeds the CPU count)")
    print(
        f"{'explorer':<26} {'events':>6} | {'median':>8} {'p90':>8} {'cpu':>8} | {'naive':>8} {'cpu':>8} "
        f"| {'ratio':>5}  verdict"
    )
    ok = True
    for name, run in RUNS.items():
        if args.only and not any(word in name for word in args.only):
            continue
        with contextlib.redirect_stdout(io.StringIO()):  # the naive functions print their summaries
            (ours, ours_cpu), (naive, naive_cpu) = run(args.events, args.naive_events)
        med, p90 = statistics.median(ours), statistics.quantiles(ours, n=10)[-1]
        nmed = statistics.median(naive)
        ratio = med / nmed
        good = med <= TARGET_MS and ratio <= TARGET_RATIO
        ok &= good
        print(
            f"{name:<26} {len(ours):>6} | {med:>6.1f}ms {p90:>6.1f}ms {statistics.median(ours_cpu):>6.1f}ms "
            f"| {nmed:>6.0f}ms {statistics.median(naive_cpu):>6.0f}ms | {ratio:>5.2f}  "
            + ("ok" if good else "MISSED")
        )
    return 0 if ok or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
