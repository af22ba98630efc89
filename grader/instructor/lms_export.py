"""Grades in the files an LMS imports as they are, and one row per student and exercise.

Written by ``python -m grader export`` beside grades.csv (``--roster`` names the class list):

- ``canvas_import.csv``: Canvas's gradebook import layout: ``Student``, ``ID``, ``SIS User ID``,
  ``SIS Login ID``, ``Section``, then one column per lesson (a column Canvas does not know becomes a
  new assignment), and a ``Points Possible`` row. With a roster (Canvas's own gradebook export, as
  ``collect --roster`` takes it) its five columns are copied for each student, so Canvas matches the
  rows by its own ids; without one they come from nbgrader's students (``lms_user_id`` as ``ID``).
- ``moodle_import.csv``: for Moodle's "Import grades from CSV": ``Email address``, ``Username``,
  ``First name``, ``Last name``, then one column per lesson (map a lesson column to a grade item
  and the email or username to the user when importing).
- ``exercise_scores.csv``: every test cell of every graded submission: student, lesson,
  exercise, check, points, score, what differs and the named mistake.

A lesson a student never submitted is blank (an LMS then keeps what it had), unless its due date
in the gradebook has passed: then it is 0. A submission that could not be graded is blank too and
listed by the class report. Scores are the grading records' with the instructor's changes in the
gradebook (manual scores, extra credit, late penalties: ``report.as_decided``), late penalties taken off.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from grader import course
from grader.classroom import lessons
from grader.instructor import collect, escape, students

CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_IDENTITY = ["Email address", "Username", "First name", "Last name"]


def _person(sid: str, **known: str) -> dict[str, str]:
    """One student's identity columns: what is known, "" for the rest (the login is the student id)."""
    blank = dict.fromkeys(["Student", "ID", "SIS User ID", "Section", "email", "first", "last"], "")
    return {**blank, "id": sid, "Student": sid, "SIS Login ID": sid, **known}


def _people(roster: Path | None) -> list[dict[str, str]]:
    """Every student to list, in order: the roster's rows, else nbgrader's students, else the graded."""
    if roster is not None:
        people = []
        for sid, row, raw in students.roster_rows(roster):
            first = row.get("first name", "")
            last = row.get("last name", "") or row.get("surname", "")
            name = (
                raw.get("Student") or row.get("sortable name") or row.get("full name") or row.get("name", "")
            )
            people.append(
                _person(
                    sid,
                    Student=name,
                    ID=raw.get("ID", "") or row.get("canvas user id", "") or row.get("user id", ""),
                    **{k: raw.get(k, "") for k in ("SIS User ID", "SIS Login ID", "Section")},
                    email=row.get("email", "") or row.get("email address", ""),
                    first=first,
                    last=last,
                )
            )
        return people
    return _gradebook_people()


def _gradebook_people() -> list[dict[str, str]]:
    import sqlite3

    db = course.work_dir() / "gradebook.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT id, first_name, last_name, email, lms_user_id FROM student ORDER BY id"
        ).fetchall()
    people = []
    for sid, first, last, email, lms in rows:
        name = ", ".join(x for x in (last, first) if x) or sid
        people.append(
            _person(sid, Student=name, ID=lms or "", email=email or "", first=first or "", last=last or "")
        )
    return people


def _past_due(lesson: str, now: datetime.datetime) -> bool:
    due = collect.due_date(lesson)
    return due is not None and due <= now


def _cell(record: dict | None, lesson: str, now: datetime.datetime) -> str:
    """One student's score for one lesson as an LMS should take it ("" leaves the LMS's value)."""
    if record is None:
        return "0" if _past_due(lesson, now) else ""
    if record.get("status") == "grading failed":
        return ""
    score = max(0.0, float(record.get("score") or 0) - float(record.get("late_penalty") or 0))
    return f"{score:g}"


def write(
    out_dir: Path, records: list[dict], only_lessons: list[str] | None = None, roster: Path | None = None
) -> dict[str, Path]:
    """Write the three files into ``out_dir``; return their paths."""
    ids = only_lessons or course.lessons()
    possible = {lid: lessons.lesson(lid).max_score for lid in ids}
    by_key = {(r["student"], r["lesson"]): r for r in records}
    people = _people(roster)
    listed = {p["id"] for p in people}
    for sid in sorted({r["student"] for r in records} - listed):  # graded, but on no list
        people.append(_person(sid))
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    paths = {"canvas": out_dir / "canvas_import.csv", "moodle": out_dir / "moodle_import.csv"}
    with paths["canvas"].open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(CANVAS_IDENTITY + ids)
        w.writerow(["    Points Possible", "", "", "", ""] + [f"{possible[lid]:g}" for lid in ids])
        for p in people:
            w.writerow(
                [p[c] for c in CANVAS_IDENTITY] + [_cell(by_key.get((p["id"], lid)), lid, now) for lid in ids]
            )
    with paths["moodle"].open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(MOODLE_IDENTITY + ids)
        for p in people:
            w.writerow(
                [p["email"], p["id"], p["first"], p["last"]]
                + [_cell(by_key.get((p["id"], lid)), lid, now) for lid in ids]
            )
    paths["exercise_scores"] = out_dir / "exercise_scores.csv"
    with paths["exercise_scores"].open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(
            [
                "student",
                "lesson",
                "exercise",
                "check",
                "points",
                "score",
                "status",
                "what_differs",
                "diagnosis",
            ]
        )
        for r in records:
            for c in r.get("cells", []):
                lines = [ln.strip() for ln in (c.get("message") or "").strip().splitlines()]
                differs = next(
                    (ln for ln in lines if ln.startswith("What differs:")), lines[0] if lines else ""
                )
                w.writerow(
                    [
                        r["student"],
                        r["lesson"],
                        c.get("exercise", ""),
                        c.get("grade_id", ""),
                        c.get("points", ""),
                        c.get("score", ""),
                        r.get("status", ""),
                        differs.removeprefix("What differs:").strip()[:300],
                        c.get("diagnosis") or "",
                    ]
                )
    return paths
