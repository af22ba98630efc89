"""Match a submission's cells to the released notebook, repair what a student damaged, cap outputs.

``repair`` (pure: a notebook and the release's cells in, notes out) matches
every cell that carries an nbgrader role to the release, by grade id, then by
cell id, then (for a test cell whose metadata was removed) by its source:

- a test cell turned into an answer cell, given other points, or otherwise
  re-labelled gets the release's metadata and source back (points always come
  from the release);
- duplicated grade ids: one cell keeps the role (the copy most like the
  release, then the first after the release cell before it); a copy of a test
  cell is removed, a copy of an answer cell runs as ordinary code;
- a cell with a grade id the release does not know (a renamed test cell) is
  removed if it claims to be a test, otherwise runs as ordinary code; the test
  cell it replaced is then missing and is put back from the source;
- any other nbgrader metadata (empty, malformed, another schema) is removed, so
  nbgrader's own checks never stop a run.

``RestoreCells`` (configured in ``nbgrader_config.py``, so plain ``nbgrader
autograde`` uses it too) runs ``repair`` against the gradebook's copy of the
release, then nbgrader's ``OverwriteCells``, then puts back deleted test cells
after the nearest earlier release cell still in the notebook (nbgrader's own
restore fails with a KeyError when a locked markdown cell comes first).

``CapOutputs`` keeps at most ``max_bytes`` of output per cell (64 KB), with a
note saying how much was cut: a 100 MB print gives a small autograded notebook
and a small feedback page.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from nbformat import NotebookNode
from nbgrader.preprocessors import NbGraderPreprocessor, OverwriteCells
from traitlets import Integer

from grader.classroom.lessons import HIDDEN_BLOCK, ReleaseCell

# ------------------------------------------------------------------ matching and repair


def _meta(cell: Any) -> dict | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else None


def _grade_id(cell: Any) -> str | None:
    meta = _meta(cell)
    gid = meta.get("grade_id") if meta else None
    return gid if isinstance(gid, str) and gid else None


def _source(cell: Any) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _kind(meta: dict) -> str:
    if meta.get("grade") and not meta.get("solution"):
        return "test cell"
    if meta.get("solution"):
        return "answer cell"
    return "locked cell" if meta.get("locked") else "cell"


def _set_type(cell: Any, cell_type: str) -> None:
    cell["cell_type"] = cell_type
    if cell_type == "code":
        cell["outputs"] = []
        cell["execution_count"] = None
    else:
        cell.pop("outputs", None)
        cell.pop("execution_count", None)


def _changes(cell: Any, rel: ReleaseCell) -> list[str]:
    """How a matched cell's role differs from the release's."""
    meta = _meta(cell) or {}
    found = []
    if cell.get("cell_type") != rel.cell_type:
        found.append(f"made a {cell.get('cell_type')} cell")
    if not rel.solution and meta.get("solution"):  # a test cell too
        found.append("turned into an answer cell")
    elif rel.solution and not meta.get("solution"):
        found.append("no longer an answer cell")
    elif rel.solution and bool(meta.get("grade")) != rel.grade:
        found.append("turned into a graded cell" if meta.get("grade") else "no longer graded")
    elif rel.is_test and not meta.get("grade"):
        found.append("no longer graded")
    if bool(meta.get("locked")) != rel.locked and not found:
        found.append("unlocked" if rel.locked else "locked")
    if rel.grade and meta.get("grade"):
        try:
            points = float(meta.get("points"))
        except (TypeError, ValueError):
            points = None
        if points != rel.points:
            found.append(f"points changed to {meta.get('points')!r}")
    return found


def repair(nb: Any, release: list[ReleaseCell]) -> list[str]:
    """Match ``nb``'s cells to the release and repair them in place; return what was repaired."""
    by_name = {r.name: r for r in release}
    notes: list[str] = []
    cells = list(nb.cells)
    keep: dict[str, Any] = {}  # release name -> the submitted cell that holds it
    dropped: set[int] = set()
    held: set[int] = set()

    # 1. by grade id; a duplicated id keeps the copy most like the release, then the first one after
    # the release cell before it (a test cell's copy pasted above its answer does not run in its place)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, cell in enumerate(cells):
        gid = _grade_id(cell)
        if gid in by_name:
            groups[gid].append(i)
    order = [r.name for r in release]
    for name, found in groups.items():
        rel = by_name[name]
        earlier = (groups[e] for e in reversed(order[: order.index(name)]) if len(groups.get(e, ())) == 1)
        after = next(earlier, [-1])[0]

        def likeness(i: int, rel: ReleaseCell = rel, after: int = after) -> tuple:
            c = cells[i]
            src = _source(c).strip()
            return (
                c.get("id") != rel.name,
                c.get("cell_type") != rel.cell_type,
                bool(_changes(c, rel)),
                rel.locked and src not in (rel.source.strip(), rel.student_source.strip()),
                i < after,
                i,
            )

        best = min(found, key=likeness)
        keep[name] = cells[best]
        held.add(best)
        for i in found:
            if i == best:
                continue
            if rel.solution:
                notes.append(f"{name}: answer cell duplicated (the copy runs as ordinary code)")
                cells[i].metadata.pop("nbgrader", None)
            else:
                notes.append(f"{name}: {_kind(rel.metadata())} duplicated (the copy was removed)")
                dropped.add(i)

    # 2. release cells missing under their grade id: found by cell id, or a test by its source
    for rel in release:
        if rel.name in keep:
            continue
        free = [i for i in range(len(cells)) if i not in held and i not in dropped]
        match = next((i for i in free if cells[i].get("id") == rel.name), None)
        if match is None and rel.is_test and rel.student_source.strip():
            match = next(
                (
                    i
                    for i in free
                    if _meta(cells[i]) is None
                    and cells[i].get("cell_type") == "code"
                    and _source(cells[i]).strip() == rel.student_source.strip()
                ),
                None,
            )
        if match is None:
            continue
        cell = cells[match]
        gid = _grade_id(cell)
        if gid is not None and gid not in by_name:
            how = f"grade id renamed to {gid!r}"
        elif gid is not None:
            continue  # it holds another release cell's id (handled there)
        else:
            how = "nbgrader metadata removed"
        kind = _kind(rel.metadata())
        notes.append(f"{rel.name}: {kind} {how} (restored)")
        cell.setdefault("metadata", {})["nbgrader"] = rel.metadata()
        if rel.locked:
            _set_type(cell, rel.cell_type)
            cell["source"] = rel.source
        keep[rel.name] = cell
        held.add(match)

    # 3. every kept cell gets the release's role back
    for name, cell in keep.items():
        rel = by_name[name]
        meta = _meta(cell) or {}
        changes = _changes(cell, rel)
        if changes:
            notes.append(
                f"{name}: {_kind(rel.metadata())} " + ", ".join(changes) + " (restored from the release)"
            )
        if changes or meta.get("schema_version") != 3 or meta.get("grade_id") != name:
            checksum = meta.get("checksum")
            cell.metadata["nbgrader"] = rel.metadata()
            if checksum and not changes:
                cell.metadata["nbgrader"]["checksum"] = checksum
            if cell.get("cell_type") != rel.cell_type:
                _set_type(cell, rel.cell_type)
            if rel.locked:
                cell["source"] = rel.source
                if rel.cell_type == "code":
                    cell["outputs"] = []

    # 4. any other nbgrader metadata: a forged test cell goes, anything else runs as ordinary code
    for i, cell in enumerate(cells):
        if i in held or i in dropped or "nbgrader" not in cell.get("metadata", {}):
            continue
        meta = _meta(cell) or {}
        gid = _grade_id(cell)
        label = f"a cell with grade id {gid!r}" if gid else "a cell with nbgrader metadata"
        if (meta.get("grade") and not meta.get("solution")) or (meta.get("locked") and gid):
            notes.append(f"{label} the release does not have was removed (test cells come from the release)")
            dropped.add(i)
        else:
            if meta.get("grade") or meta.get("solution") or gid:
                notes.append(f"{label} the release does not have runs as ordinary code")
            cell.metadata.pop("nbgrader", None)
    nb.cells = [c for i, c in enumerate(cells) if i not in dropped]
    return notes


def release_from_gradebook(gradebook: Any, notebook_id: str, assignment_id: str) -> list[ReleaseCell]:
    """The release's cells with an nbgrader role, as the gradebook recorded them."""
    source_nb = gradebook.find_notebook(notebook_id, assignment_id)
    grades = {c.name: float(c.max_score) for c in source_nb.grade_cells}
    tasks = {c.name: float(c.max_score) for c in source_nb.task_cells}
    solutions = {c.name for c in source_nb.solution_cells}
    return [
        ReleaseCell(
            name=cell.name,
            cell_type=cell.cell_type,
            source=cell.source,
            grade=cell.name in grades,
            solution=cell.name in solutions,
            locked=bool(cell.locked),
            task=cell.name in tasks,
            points=grades.get(cell.name, tasks.get(cell.name, 0.0)),
        )
        for cell in source_nb.source_cells
    ]


class RestoreCells(OverwriteCells):
    """Repair the submission against the release, then nbgrader's OverwriteCells and a sturdier restore."""

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        from nbgrader.api import Gradebook

        nbg = resources["nbgrader"]
        with Gradebook(nbg["db_url"]) as gb:
            release = release_from_gradebook(gb, nbg["notebook"], nbg["assignment"])
        for note in repair(nb, release):
            self.log.warning("Repaired: %s", note)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: Any, resources: Any, cell_index: int) -> tuple[Any, Any]:
        self._cell = cell
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name: str, attr: str, old_value: Any, new_value: Any) -> None:
        """nbgrader's warning, except for an unedited test cell whose hidden tests are being put back."""
        if attr == "checksum":
            source = self.gradebook.find_source_cell(name, self.notebook_id, self.assignment_id).source
            if HIDDEN_BLOCK.sub("", source).strip() == str(self._cell.source).strip():
                return
        super().report_change(name, attr, old_value, new_value)

    def add_missing_grade_cells(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source_cells = list(source_nb.source_cells)
        order = [cell.name for cell in source_cells]
        grade_cells = {cell.name: cell for cell in source_nb.grade_cells}
        solution_ids = {cell.name for cell in source_nb.solution_cells}
        for index, name in enumerate(order):
            if name not in grade_cells:
                continue
            present = {
                cell.metadata.get("nbgrader", {}).get("grade_id"): i
                for i, cell in enumerate(nb.cells)
                if cell.metadata.get("nbgrader", {}).get("grade_id")
            }
            if name in present:
                continue
            self.log.warning(f"Missing grade cell {name} encountered, adding to notebook")
            cell = self.missing_cell_transform(
                source_cells[index], grade_cells[name].max_score, is_solution=name in solution_ids
            )
            ids = {c.get("id") for c in nb.cells}
            cell["id"] = name if name not in ids else f"{name}-restored"  # nbformat 4.5 needs an id
            where = 0
            for earlier in reversed(order[:index]):
                if earlier in present:
                    where = present[earlier] + 1
                    break
            nb.cells.insert(where, cell)
        return nb, resources

    def add_missing_task_cells(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        """nbgrader's version, minus its KeyError on cells whose nbgrader metadata has no grade id."""
        source_nb = self.gradebook.find_notebook(self.notebook_id, self.assignment_id)
        source_cells = list(source_nb.source_cells)
        names = [cell.name for cell in source_cells]
        present = {cell.metadata.get("nbgrader", {}).get("grade_id") for cell in nb.cells}
        for task in source_nb.task_cells:
            if task.name not in present:
                cell = self.missing_cell_transform(
                    source_cells[names.index(task.name)], task.max_score, is_task=True
                )
                cell["id"] = f"{task.name}-restored"
                nb.cells.append(cell)
        return nb, resources


# ------------------------------------------------------------------ bounded outputs

MAX_OUTPUT = 64 * 1024
CUT_NOTE = re.compile(r"\n\[output cut: [^\]\n]* not shown; a cell keeps at most [^\]\n]*\]\n")


def _size(n: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _cut_text(text: str, budget: int) -> tuple[str, int]:
    """The first ``budget`` bytes of text (whole characters), and how many bytes were cut."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= budget:
        return text, 0
    return raw[: max(budget, 0)].decode("utf-8", errors="ignore"), len(raw) - max(budget, 0)


def cap_outputs(cell: Any, max_bytes: int = MAX_OUTPUT) -> int:
    """Keep at most ``max_bytes`` of a code cell's outputs, with a note; return the bytes cut."""
    if cell.get("cell_type") != "code" or not cell.get("outputs"):
        return 0
    budget = max_bytes
    cut = 0
    kept = []
    for out in cell.outputs:
        kind = out.get("output_type")
        if kind == "stream" and CUT_NOTE.fullmatch(str(out.get("text", ""))):
            kept.append(out)  # cut before (when the notebook was graded): the note does not count
            continue
        if kind == "stream":
            text = out.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            out["text"], lost = _cut_text(text, budget)
            budget -= len(text.encode("utf-8", errors="replace")) - lost
            cut += lost
            if lost and not out["text"] and out.get("name") != "stderr":
                continue
        elif kind == "error":
            half = max(budget, 4096) // 2
            evalue, lost = _cut_text(str(out.get("evalue", "")), half)
            out["evalue"] = evalue
            cut += lost
            frames = "\n".join(str(t) for t in out.get("traceback", []))
            shown, lost = _cut_text(frames, half)
            if lost:
                out["traceback"] = shown.split("\n")
                cut += lost
            budget -= len(evalue.encode("utf-8", errors="replace")) + len(
                shown.encode("utf-8", errors="replace")
            )
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            size = len(json.dumps(data))
            if size > budget:
                plain = data.get("text/plain", "")
                plain = "".join(plain) if isinstance(plain, list) else str(plain)
                plain, _ = _cut_text(plain, max(min(budget, 2048), 0))
                out["data"] = {"text/plain": plain}
                out["metadata"] = {}
                cut += size - len(json.dumps(out["data"]))
                budget -= len(plain.encode("utf-8", errors="replace"))
            else:
                budget -= size
        kept.append(out)
        budget = max(budget, 0)
    if cut:
        kept.append(
            NotebookNode(
                output_type="stream",
                name="stdout",
                text=f"\n[output cut: {_size(cut)} not shown; a cell keeps at most {_size(max_bytes)}]\n",
            )
        )
    cell.outputs = kept
    return cut


class CapOutputs(NbGraderPreprocessor):
    """Keep at most ``max_bytes`` of output per cell, with a note saying how much was cut."""

    max_bytes = Integer(MAX_OUTPUT, help="bytes of output kept per cell").tag(config=True)

    def preprocess(self, nb: Any, resources: Any) -> tuple[Any, Any]:
        nb.metadata.pop("widgets", None)  # the kernel's widget state: no cap, and nothing graded shows it
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell: Any, resources: Any, index: int) -> tuple[Any, Any]:
        cut = cap_outputs(cell, self.max_bytes)
        if cut:
            self.log.warning("Output of cell %d cut by %s", index, _size(cut))
        return cell, resources
