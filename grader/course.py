"""Drive nbgrader on this course from Python: config loading and notebook builds.

The course root is the folder holding ``nbgrader_config.py``. Everything a run
writes goes to the git-ignored work folder (``_grading/`` unless
``ATTENTION_COURSE_WORK`` says otherwise).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def lessons(root: Path = ROOT) -> list[str]:
    """Lesson ids (``01_projection``, ...) found in solutions/, in order."""
    return sorted(p.parent.name for p in (root / "solutions").glob("*/*.ipynb") if p.stem == p.parent.name)


def ensure_tools_on_path() -> None:
    """nbgrader shells out to ``alembic``: put this interpreter's bin/ first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir, *parts])


def api(root: Path = ROOT, **overrides):
    """An ``NbGraderAPI`` configured from the course's nbgrader_config.py.

    ``overrides`` are extra ``CourseDirectory`` settings, e.g. ``release_directory``.
    """
    ensure_tools_on_path()
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    config = Config(PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config())
    for key, value in overrides.items():
        config.CourseDirectory[key] = value
    return NbGraderAPI(config=config)


def build_notebooks(
    root: Path = ROOT, release_dir: Path | None = None, only: list[str] | None = None
) -> list[Path]:
    """Regenerate the student notebooks from solutions/ with nbgrader.

    Writes to notebooks/ (or ``release_dir``) and records the lessons' test cells
    in the gradebook, which autograding later restores them from.
    """
    overrides = {}
    if release_dir is not None:
        overrides["release_directory"] = str(Path(release_dir).resolve())
    nbapi = api(root, **overrides)
    written = []
    for lesson in only or lessons(root):
        result = nbapi.generate_assignment(lesson, force=True)
        if not result["success"]:
            raise RuntimeError(
                f"nbgrader could not generate {lesson}:\n{result['log']}\n{result.get('error', '')}"
            )
        out_root = Path(release_dir) if release_dir is not None else root / "notebooks"
        written.append(out_root / lesson / f"{lesson}.ipynb")
    return written


def work_dir() -> Path:
    """The folder a grading run writes to (submissions, autograded copies, gradebook)."""
    return Path(os.environ.get("ATTENTION_COURSE_WORK", ROOT / "_grading"))


def secret(folder: Path | None = None) -> bytes:
    """The course's grading secret: made once (32 random bytes, readable by the instructor alone) in
    the work folder, beside the gradebook, where student code never reaches."""
    path = (folder or work_dir()) / ".hidden-cases-secret"
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = path.with_name(f"{path.name}.{os.getpid()}")
    fresh.write_text(os.urandom(32).hex())
    fresh.chmod(0o600)
    try:
        os.link(fresh, path)  # the first of several racing processes wins; all then read its secret
    except FileExistsError:
        pass
    finally:
        fresh.unlink()
    return bytes.fromhex(path.read_text().strip())


def case_salt(lesson: str, student: str, submission: list[str]) -> int:
    """What the seeds of a submission's hidden cases are drawn with: the course secret, the lesson, the
    student and what the student handed in (the digest of its bytes), so each attempt meets inputs of
    its own, and a regrade of the same notebook the same ones."""
    import hashlib
    import hmac

    text = "\0".join([lesson, student, *submission]).encode("utf-8", "surrogatepass")
    digest = hmac.new(secret(), text, hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def submission_path(lesson: str, student: str, root: Path = ROOT) -> Path:
    """Where nbgrader expects a student's submitted notebook for a lesson."""
    return work_dir() / "submitted" / student / lesson / f"{lesson}.ipynb"


def autograded_path(lesson: str, student: str) -> Path:
    return work_dir() / "autograded" / student / lesson / f"{lesson}.ipynb"


def autograde(lesson: str, student: str, root: Path = ROOT) -> dict:
    """Autograde one submission with nbgrader; return its scores from the gradebook.

    Returns ``{"score": float, "max_score": float, "grades": {grade_id: (score, max)}}``.
    """
    result = api(root).autograde(lesson, student, force=True, create=True)
    if not result["success"]:
        raise RuntimeError(
            f"autograde of {student}/{lesson} failed:\n{result['log']}\n{result.get('error', '')}"
        )
    return gradebook_scores(lesson, student, root)


def gradebook_scores(lesson: str, student: str, root: Path = ROOT) -> dict:
    """A submission's total and per-test scores, read from the gradebook."""
    from nbgrader.api import Gradebook

    nbapi = api(root)
    with Gradebook(nbapi.coursedir.db_url, nbapi.coursedir.course_id) as gb:
        sub = gb.find_submission_notebook(lesson, lesson, student)
        grades = {g.name: (g.score, g.max_score) for g in sub.grades if g.cell.max_score}
        return {"score": sub.score, "max_score": sub.max_score, "grades": grades}
