"""Put deleted test cells back where they belong, whatever the student deleted around them.

nbgrader's ``OverwriteCells`` (with ``add_missing_cells``) re-inserts a deleted
grade cell after the cell that precedes it in the source, but looks that cell
up only among grade and solution cells: when a locked markdown cell comes
first (a "Visible checks" heading, as in every lesson here) it fails with a
KeyError and the whole submission is not graded. ``RestoreCells`` inserts it
after the nearest earlier source cell still in the notebook, or at the top.
"""

from __future__ import annotations

from typing import Any

from nbgrader.preprocessors import OverwriteCells


class RestoreCells(OverwriteCells):
    """OverwriteCells whose missing-cell restore survives any deletion pattern."""

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
