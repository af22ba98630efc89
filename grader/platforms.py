"""Where the lessons run: Colab and Binder badges, and the Colab setup cell of every lesson.

One setting drives it all, the course's public repository in pyproject.toml::

    [tool.attention-course]
    repository = "https://github.com/OWNER/NAME"
    branch = "main"          # optional

Commands (``python -m grader.platforms <command>``):

  apply    put the badges and the Colab setup cell, generated from the setting, into
           every solutions/*/*.ipynb (idempotent); then run ``python -m grader build``
  check    exit 1 and say which lessons lack them or carry stale ones
  badges   print the badge lines for the README
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import nbformat

from attention_course import colab

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (a JupyterLab dependency there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

#: Cell id and nbgrader grade id of the setup cell (the first code cell of a lesson).
CELL_ID = "colab-setup"
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
BINDER_BADGE = "https://mybinder.org/badge_logo.svg"
_BADGE_LINE = re.compile(re.escape(COLAB_BADGE) + "|" + re.escape(BINDER_BADGE))


@dataclass(frozen=True)
class Settings:
    """The course's repository on GitHub, where Colab and Binder fetch it from."""

    repository: str
    branch: str = "main"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", self.repository):
            raise ValueError(
                f"repository must be a GitHub address like https://github.com/OWNER/NAME "
                f"(Colab and Binder open notebooks from GitHub), got {self.repository!r}"
            )
        if not re.fullmatch(r"[\w./-]+", self.branch):
            raise ValueError(f"branch {self.branch!r} is not a plain branch name")

    @property
    def slug(self) -> str:
        """``OWNER/NAME``."""
        return self.repository.removeprefix("https://github.com/")


def settings(root: Path = ROOT) -> Settings:
    """The ``[tool.attention-course]`` table of pyproject.toml."""
    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["attention-course"]
    repository = table["repository"].rstrip("/").removesuffix(".git")
    return Settings(repository=repository, branch=table.get("branch", "main"))


# ------------------------------------------------------------------ links


def student_path(lesson: str) -> str:
    """Where a lesson's student version lives in the repository."""
    return f"notebooks/{lesson}/{lesson}.ipynb"


def colab_url(s: Settings, path: str) -> str:
    return f"https://colab.research.google.com/github/{s.slug}/blob/{s.branch}/{path}"


def binder_url(s: Settings, path: str | None = None) -> str:
    """A mybinder.org launch link; with ``path``, JupyterLab opens that file."""
    url = f"https://mybinder.org/v2/gh/{s.slug}/{s.branch}"
    return url + (f"?urlpath={quote('lab/tree/' + path, safe='')}" if path else "")


def badges(s: Settings, lesson: str | None = None) -> str:
    """One markdown line: 'Open in Colab' and 'Launch Binder' for a lesson (default: lesson 01 / the course)."""
    colab_target = student_path(lesson or "01_projection")
    binder_target = student_path(lesson) if lesson else "notebooks"
    return (
        f"[![Open in Colab]({COLAB_BADGE})]({colab_url(s, colab_target)}) "
        f"[![Launch Binder]({BINDER_BADGE})]({binder_url(s, binder_target)})"
    )


def lesson_table(s: Settings, root: Path = ROOT) -> str:
    """A markdown table with both badges for every lesson in solutions/."""
    from grader import course

    rows = ["| lesson | Colab | Binder |", "|---|---|---|"]
    for lesson in course.lessons(root):
        path = student_path(lesson)
        rows.append(
            f"| {lesson} | [![Open in Colab]({COLAB_BADGE})]({colab_url(s, path)}) "
            f"| [![Launch Binder]({BINDER_BADGE})]({binder_url(s, path)}) |"
        )
    return "\n".join(rows)


# ------------------------------------------------------------------ the setup cell


def setup_cell_source(s: Settings) -> str:
    """The source of a lesson's first code cell: fetch helpers and data on Colab, nothing elsewhere."""
    fetch = textwrap.indent(inspect.getsource(colab.fetch_course), "    ")
    return (
        '# @title Run me first on Google Colab (elsewhere this does nothing) { display-mode: "form" }\n'
        f"# On Google Colab this fetches the course's helpers and data/ from {s.repository}\n"
        f"# (branch {s.branch}); in JupyterLab, on Binder and while a notebook is graded it does nothing.\n"
        "import os\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules and not os.environ.get("NBGRADER_EXECUTION"):\n'
        "\n"
        f"{fetch}\n"
        f"    fetch_course({json.dumps(s.repository)}, {json.dumps(s.branch)})\n"
        "    from attention_course.colab import setup\n"
        "\n"
        "    setup()"
    )


def setup_cell(s: Settings) -> nbformat.NotebookNode:
    """The setup cell: locked (nbgrader restores it when grading), folded in Colab and JupyterLab."""
    cell = nbformat.v4.new_code_cell(setup_cell_source(s), id=CELL_ID)
    cell.metadata = nbformat.from_dict(
        {
            "cellView": "form",
            "jupyter": {"source_hidden": True},
            "nbgrader": {
                "grade": False,
                "grade_id": CELL_ID,
                "locked": True,
                "schema_version": 3,
                "solution": False,
                "task": False,
            },
        }
    )
    return cell


def _with_badges(source: str, line: str) -> str:
    lines = [x for x in source.split("\n") if not _BADGE_LINE.search(x)]
    head = lines[:1] if lines and lines[0].startswith("#") else []
    rest = lines[len(head) :]
    while rest and not rest[0].strip():
        rest.pop(0)
    return "\n".join([*head, *([""] if head else []), line, "", *rest]).rstrip("\n")


def apply_to_notebook(nb: nbformat.NotebookNode, lesson: str, s: Settings) -> bool:
    """Put the badges into the title cell and the setup cell at index 1; True if nb changed."""
    before = json.dumps(nb, sort_keys=True)
    if not nb.cells or nb.cells[0].cell_type != "markdown":
        raise ValueError(f"{lesson}: the first cell should be the lesson's title (markdown)")
    nb.cells[0].source = _with_badges(nb.cells[0].source, badges(s, lesson))
    nb.cells = [nb.cells[0]] + [c for c in nb.cells[1:] if not _is_setup_cell(c)]
    nb.cells.insert(1, setup_cell(s))
    return json.dumps(nb, sort_keys=True) != before


def _is_setup_cell(cell) -> bool:
    return cell.get("id") == CELL_ID or cell.metadata.get("nbgrader", {}).get("grade_id") == CELL_ID


def _lesson_files(root: Path, folder: str = "solutions") -> list[Path]:
    return sorted(p for p in (root / folder).glob("*/*.ipynb") if p.stem == p.parent.name)


def apply(root: Path = ROOT, s: Settings | None = None, only: list[str] | None = None) -> list[Path]:
    """Refresh badges and setup cell in every solutions/*/*.ipynb under root; return the files changed."""
    s = s or settings(root)
    changed = []
    for path in _lesson_files(root):
        if only and path.stem not in only:
            continue
        nb = nbformat.read(path, as_version=4)
        if apply_to_notebook(nb, path.stem, s):
            nbformat.validate(nb)
            nbformat.write(nb, path)
            changed.append(path)
    return changed


def problems(root: Path = ROOT, s: Settings | None = None, folders=("solutions", "notebooks")) -> list[str]:
    """What `apply` (then `python -m grader build`) would fix: one line per stale lesson."""
    s = s or settings(root)
    found = []
    for folder in folders:
        for path in _lesson_files(root, folder):
            nb = nbformat.read(path, as_version=4)
            title = nb.cells[0].source if nb.cells and nb.cells[0].cell_type == "markdown" else ""
            first_code = next((c for c in nb.cells if c.cell_type == "code"), None)
            where = f"{folder}/{path.parent.name}"
            if badges(s, path.stem) not in title:
                found.append(f"{where}: the title cell lacks the current Colab and Binder badges")
            if first_code is None or first_code.source != setup_cell_source(s):
                found.append(f"{where}: the first code cell is not the current Colab setup cell")
    return found


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.platforms", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd_apply = sub.add_parser("apply", help="refresh badges and Colab setup cell in solutions/")
    cmd_apply.add_argument("lessons", nargs="*", help="lesson ids (default: all)")
    sub.add_parser("check", help="list lessons whose badges or setup cell are missing or stale")
    sub.add_parser("badges", help="print the README's badge lines")
    args = parser.parse_args(argv)
    s = settings()
    if args.command == "apply":
        changed = apply(s=s, only=args.lessons or None)
        for path in changed:
            print(f"updated {path.relative_to(ROOT)}")
        print(f"{len(changed)} lesson(s) updated; now run `python -m grader build`")
    elif args.command == "check":
        found = problems(s=s)
        for line in found:
            print(line)
        if found:
            print("run `python -m grader.platforms apply`, then `python -m grader build`")
            return 1
        print("every lesson carries the current badges and Colab setup cell")
    else:
        print(badges(s))
        print()
        print(lesson_table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
