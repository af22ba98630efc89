"""Export: nbgrader's grades CSV, and a class report an instructor can read in a minute.

Written to ``<work>/report/`` (or ``--out``):

- ``grades.csv``: nbgrader's export columns (one row per student and lesson) holding the
  tool's own values (its grading records), plus ``gradebook_check``: only the grading run writes
  grades, so every gradebook row it did not write, or that differs from what
  it wrote (a score edited in the database, a manual grade, a run of plain nbgrader), is
  flagged there and in the class report; a lesson the student never submitted has blank scores
  (``nbgrader export`` writes 0);
- ``class_report.md``: per-exercise pass rates, the most frequent diagnosed
  misconceptions, submissions flagged for tampering, the ones that did not run
  cleanly, and the slowest;
- ``class_report.png``: the pass rates and the misconceptions in one 16:9
  chart, ready for a slide;
- ``exercises.csv``, ``misconceptions.csv``, ``submissions.csv``: the same
  numbers as tables.

Names, messages, flags and notes can come from what a student handed in (a check's message holds
the error text their code raised): every CSV cell of text that a spreadsheet would read
as a formula starts with ``'``, and the Markdown report shows them as escaped text
(``grader/instructor/escape.py``). ``SafeCsvExport`` does the same for plain ``nbgrader export``.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import grading
from grader.classroom.grades import course_config, gradebook_url
from grader.instructor import escape


def submission_in_gradebook(gb: Any, lesson: str, student: str) -> dict | None:
    """What an open nbgrader ``Gradebook`` holds for one submission (None: no row)."""
    from nbgrader.api import MissingEntry

    try:
        sub = gb.find_submission(lesson, student)
    except MissingEntry:
        return None
    grades: dict[str, float] = {}
    for nb in sub.notebooks:
        for g in nb.grades:
            grades[g.name] = float(g.score or 0) + float(g.extra_credit or 0)
    return {
        "timestamp": str(sub.timestamp) if sub.timestamp else None,
        "late_penalty": float(sub.late_submission_penalty or 0),
        "score": float(sub.score or 0),
        "grades": grades,
    }


@dataclass
class ExerciseStats:
    lesson: str
    exercise: str
    submissions: int = 0
    passed: int = 0  # every check of the exercise got full points
    points: float = 0.0
    earned: float = 0.0

    @property
    def pass_rate(self) -> float:
        return self.passed / self.submissions if self.submissions else 0.0


@dataclass
class ClassReport:
    exercises: list[ExerciseStats] = field(default_factory=list)
    misconceptions: list[tuple[str, str, int]] = field(
        default_factory=list
    )  # (exercise, diagnosis, students)
    flagged: list[dict] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)  # submissions that did not run cleanly
    slowest: list[dict] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    submissions: int = 0
    gradebook: list[dict] = field(default_factory=list)  # gradebook rows that disagree with the records


def build(records: list[dict]) -> ClassReport:
    """The class report's numbers, from the grading records."""
    rep = ClassReport(submissions=len(records))
    stats: dict[tuple[str, str], ExerciseStats] = {}
    diag: Counter = Counter()
    rep.statuses = dict(Counter(r.get("status", "?") for r in records))
    for r in records:
        by_ex: dict[str, list[dict]] = defaultdict(list)
        for c in r.get("cells", []):
            by_ex[c["exercise"]].append(c)
        for ex, cells in by_ex.items():
            s = stats.setdefault((r["lesson"], ex), ExerciseStats(r["lesson"], ex))
            s.submissions += 1
            s.points += sum(c["points"] for c in cells)
            s.earned += sum(c["score"] for c in cells)
            if all(c["score"] >= c["points"] for c in cells):
                s.passed += 1
            seen = {c["diagnosis"] for c in cells if c.get("diagnosis")}
            for d in seen:
                diag[(ex, d)] += 1
        if r.get("flags"):
            rep.flagged.append({"student": r["student"], "lesson": r["lesson"], "flags": r["flags"]})
        if r.get("status") not in ("graded",):
            rep.problems.append(
                {
                    "student": r["student"],
                    "lesson": r["lesson"],
                    "status": r.get("status"),
                    "score": r.get("score"),
                }
            )
    rep.exercises = sorted(stats.values(), key=lambda s: (s.lesson, s.exercise))
    rep.misconceptions = [(ex, d, n) for (ex, d), n in diag.most_common()]
    rep.slowest = sorted(
        (
            {
                "student": r["student"],
                "lesson": r["lesson"],
                "seconds": r.get("seconds", 0),
                "status": r.get("status"),
            }
            for r in records
        ),
        key=lambda x: -x["seconds"],
    )[:10]
    return rep


def chart(rep: ClassReport, path: Path, top: int = 8) -> Path:
    """Pass rate per exercise and the most frequent misconceptions, one 16:9 figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 9), dpi=100, gridspec_kw={"width_ratios": [1, 1.3]})
    names = [_plain(f"{s.lesson[:2]} {s.exercise}") for s in rep.exercises]
    rates = [100 * s.pass_rate for s in rep.exercises]
    y = range(len(names))
    left.barh(list(y), rates, color="#4c78a8", height=0.6)
    left.set_ylim(max(len(names), 6) - 0.5, -0.5)
    left.set_yticks(list(y), names, fontsize=14)
    left.set_xlim(0, 100)
    left.set_xlabel("students with every check passed (%)", fontsize=14)
    left.set_title("Pass rate per exercise", fontsize=18)
    for i, (r, s) in enumerate(zip(rates, rep.exercises)):
        left.text(min(r + 1, 88), i, f"{r:.0f}%  ({s.passed}/{s.submissions})", va="center", fontsize=12)
    worst = rep.misconceptions[:top]
    if worst:
        labels = [_plain(_wrap(f"{ex}: {d}", 48)) for ex, d, _ in worst]
        counts = [n for _, _, n in worst]
        yy = range(len(worst))
        right.barh(list(yy), counts, color="#e45756", height=0.6)
        right.set_yticks(list(yy), labels, fontsize=12)
        right.set_ylim(max(len(worst), 6) - 0.5, -0.5)
        from matplotlib.ticker import MaxNLocator

        right.xaxis.set_major_locator(MaxNLocator(integer=True))
        right.set_xlabel("students", fontsize=14)
        for i, n in enumerate(counts):
            right.text(n + 0.05, i, str(n), va="center", fontsize=12)
    else:
        right.text(0.5, 0.5, "no diagnosed mistakes", ha="center", va="center", fontsize=16)
        right.set_axis_off()
    right.set_title("Most frequent misconceptions", fontsize=18)
    for ax in (left, right):
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"Attention, step by step: {rep.submissions} submissions", fontsize=20)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _plain(text: str) -> str:
    """A chart label shown as written: a ``$`` would start matplotlib's mathtext."""
    return text.replace("$", r"\$")


def _wrap(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width)
    cut = cut if cut > 0 else width
    return text[:cut] + "\n" + _wrap(text[cut:].strip(), width)


def markdown(rep: ClassReport, chart_name: str = "class_report.png") -> str:
    """The class report; every name, diagnosis, flag and note in it is escaped text (``escape.md_text``)."""
    t, code = escape.md_text, escape.md_code
    out = ["# Class report", ""]
    out.append(
        f"{rep.submissions} submissions graded. "
        + ", ".join(f"{t(k)}: {v}" for k, v in sorted(rep.statuses.items(), key=lambda kv: str(kv[0])))
    )
    out += ["", f"![pass rates and misconceptions]({chart_name})", "", "## Pass rate per exercise", ""]
    out += ["| lesson | exercise | passed | pass rate | mean points |", "|---|---|---|---|---|"]
    for s in rep.exercises:
        mean = s.earned / s.submissions if s.submissions else 0
        out.append(
            f"| {t(s.lesson)} | {code(s.exercise)} | {s.passed}/{s.submissions} | {100 * s.pass_rate:.0f}% | "
            f"{mean:.1f} / {s.points / max(s.submissions, 1):g} |"
        )
    out += ["", "## Most frequent misconceptions", ""]
    if rep.misconceptions:
        out += ["| exercise | diagnosis | students |", "|---|---|---|"]
        out += [f"| {code(ex)} | {t(d)} | {n} |" for ex, d, n in rep.misconceptions[:20]]
    else:
        out.append("None diagnosed.")
    out += ["", "## Flagged for review (signs of tampering)", ""]
    if rep.flagged:
        out += [
            f"- **{t(f['student'])}** / {t(f['lesson'])}: " + "; ".join(t(x) for x in f["flags"])
            for f in rep.flagged
        ]
        out.append("")
        out.append(
            "Scores come from the checks re-run outside the student's kernel; these flags only ask for a look."
        )
    else:
        out.append("None.")
    out += ["", "## Gradebook check", ""]
    if rep.gradebook:
        out.append(
            "The gradebook disagrees with the grading records here. A grade changed by hand (in the "
            "formgrader or with nbgrader's commands) is what every export and feedback page reports; "
            "`grades.csv` names each row in its `gradebook_check` column."
        )
        out.append("")
        out += ["| student | lesson | what differs |", "|---|---|---|"]
        out += [f"| {t(g['student'])} | {t(g['lesson'])} | {t(g['problem'])} |" for g in rep.gradebook]
    else:
        out.append("The gradebook holds exactly what the grading tool wrote.")
    out += ["", "## Did not run cleanly, or repaired", ""]
    if rep.problems:
        out += ["| student | lesson | status | score |", "|---|---|---|---|"]
        out += [
            f"| {t(p['student'])} | {t(p['lesson'])} | {t(p['status'])} | {p['score']:g} |"
            for p in rep.problems
        ]
    else:
        out.append("None.")
    out += ["", "## Slowest submissions", "", "| student | lesson | seconds | status |", "|---|---|---|---|"]
    out += [
        f"| {t(s['student'])} | {t(s['lesson'])} | {s['seconds']:.1f} | {t(s['status'])} |"
        for s in rep.slowest
    ]
    return "\n".join(out) + "\n"


GRADE_COLUMNS = [
    "assignment",
    "duedate",
    "timestamp",
    "student_id",
    "last_name",
    "first_name",
    "email",
    "raw_score",
    "late_submission_penalty",
    "score",
    "max_score",
    "gradebook_check",
    "isolation",
]


def _differences(record: dict, held: dict) -> list[str]:
    """How a gradebook row differs from the grading record the tool wrote it from."""
    found = []
    mine = {c["grade_id"]: float(c["score"]) for c in record.get("cells", [])}
    for gid in sorted(set(mine) | set(held["grades"])):
        if gid not in held["grades"]:
            found.append(f"{gid} missing")
        elif gid not in mine:
            found.append(f"{gid}: {held['grades'][gid]:g} for a check the tool did not grade")
        elif abs(held["grades"][gid] - mine[gid]) > 1e-9:
            found.append(f"{gid}: {held['grades'][gid]:g} (tool: {mine[gid]:g})")
    penalty = float(record.get("late_penalty") or 0)
    if abs(held["late_penalty"] - penalty) > 1e-9:
        found.append(f"late penalty {held['late_penalty']:g} (tool: {penalty:g})")
    if "timestamp" in record and held["timestamp"] != record["timestamp"]:
        found.append(f"timestamp {held['timestamp']} (tool: {record['timestamp']})")
    return found


def verify(records: list[dict], only_lessons: list[str] | None = None) -> tuple[list[dict], list[dict]]:
    """Grade rows from the tool's records, each checked against the gradebook; and the disagreements.

    Every lesson the gradebook knows x every student it knows or the records name: the tool's
    values where it graded the submission, unless the instructor changed them in the gradebook (a
    manual score, extra credit or a late penalty, from the formgrader or nbgrader's commands): then
    the gradebook's, listed as "changed by hand". A row the tool did not write is listed without a
    score, and so is a lesson the student never submitted (blank, where ``nbgrader export`` writes 0).
    """
    import warnings

    from nbgrader.api import Gradebook

    warnings.filterwarnings("ignore", module="nbgrader")
    cfg = course_config()
    by_key = {(r["student"], r["lesson"]): r for r in records}
    rows, problems = [], []
    with Gradebook(gradebook_url(), cfg.CourseDirectory.get("course_id", "")) as gb:
        students = {s.id: s for s in gb.students}
        student_ids = sorted(set(students) | {s for s, _ in by_key})
        assignments = {a.name: a for a in gb.assignments}
        for lesson in sorted(set(assignments) | {lesson for _, lesson in by_key}):
            if only_lessons and lesson not in only_lessons:
                continue
            assignment = assignments.get(lesson)
            for sid in student_ids:
                record = by_key.get((sid, lesson))
                held = submission_in_gradebook(gb, lesson, sid) if assignment else None
                student = students.get(sid)
                row = {
                    "assignment": lesson,
                    "duedate": assignment.duedate if assignment else "",
                    "student_id": sid,
                    "last_name": student.last_name if student else "",
                    "first_name": student.first_name if student else "",
                    "email": student.email if student else "",
                    "max_score": assignment.max_score if assignment else "",
                    "timestamp": "",
                    "raw_score": 0.0,
                    "late_submission_penalty": 0.0,
                    "score": 0.0,
                    "gradebook_check": "",
                    "isolation": "",
                }
                if record is not None:
                    record, changes = _decided(record, held)
                    penalty = float(record.get("late_penalty") or 0)
                    row.update(
                        timestamp=record.get("timestamp") or "",
                        raw_score=float(record["score"]),
                        late_submission_penalty=penalty,
                        score=max(0.0, float(record["score"]) - penalty),
                        max_score=record.get("max_score", row["max_score"]),
                        isolation=record.get("isolation", ""),
                    )
                    if record.get("status") == "grading failed":
                        problem = "could not be graded: run grade again"
                    elif held is None:
                        problem = "missing from the gradebook"
                    else:  # the instructor decided: the gradebook's values (above), said to be changed
                        problem = "changed by hand: " + "; ".join(changes) if changes else ""
                elif held is not None:
                    row.update(
                        timestamp=held["timestamp"] or "", raw_score="", late_submission_penalty="", score=""
                    )
                    problem = f"not written by the grading tool (the gradebook says {held['score']:g})"
                else:  # never submitted: no score at all, which a 0 would not say
                    row.update(raw_score="", late_submission_penalty="", score="")
                    problem = ""
                row["gradebook_check"] = problem
                if problem:
                    problems.append({"student": sid, "lesson": lesson, "problem": problem})
                rows.append({k: "" if v is None else v for k, v in row.items()})
    return rows, problems


def as_decided(records: list[dict]) -> list[dict]:
    """The records with the instructor's changes in the gradebook applied: each check's score (a manual
    score, with extra credit), the total and the late penalty, where the gradebook holds other values
    than the tool wrote (its notes then say "changed by hand" and what changed). What every export reports."""
    import warnings

    from nbgrader.api import Gradebook

    warnings.filterwarnings("ignore", module="nbgrader")
    decided = []
    with Gradebook(gradebook_url(), course_config().CourseDirectory.get("course_id", "")) as gb:
        for r in records:
            r, changes = _decided(r, submission_in_gradebook(gb, r["lesson"], r["student"]))
            if changes:
                r["notes"] = [*r.get("notes", []), "changed by hand: " + "; ".join(changes)]
            decided.append(r)
    return decided


def _decided(record: dict, held: dict | None) -> tuple[dict, list[str]]:
    """A grading record with what the gradebook holds for it (``held``) where the two differ: each
    check's score, the total, the late penalty and the time; and the differences (none: as it was)."""
    changes = _differences(record, held) if held and record.get("status") != "grading failed" else []
    if not changes:
        return record, []
    cells = [{**c, "score": held["grades"].get(c["grade_id"], c["score"])} for c in record.get("cells", [])]
    decided = {**record, "cells": cells, "score": held["score"], "late_penalty": held["late_penalty"]}
    decided["timestamp"] = held["timestamp"] or record.get("timestamp")
    return decided, changes


def grades_csv(
    path: Path, records: list[dict], only_lessons: list[str] | None = None
) -> tuple[Path, list[dict]]:
    """grades.csv in nbgrader's columns, from the tool's records, checked against the gradebook (where
    the instructor changed a grade there, the gradebook's value)."""
    rows, problems = verify(records, only_lessons)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = escape.CsvDictWriter(f, GRADE_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    return path, problems


NBGRADER_COLUMNS = GRADE_COLUMNS[: GRADE_COLUMNS.index("max_score") + 1]


def _nbgrader_rows(gradebook, assignments: list[str], students: list[str]) -> list[dict]:
    """The rows of nbgrader's own CSV export (``nbgrader.plugins.CsvExportPlugin``), as values."""
    from nbgrader.api import MissingEntry

    rows = []
    for assignment in gradebook.assignments:
        if assignments and assignment.name not in assignments:
            continue
        for student in gradebook.students:
            if students and student.id not in students:
                continue
            row = {
                "assignment": assignment.name,
                "duedate": assignment.duedate,
                "student_id": student.id,
                "last_name": student.last_name,
                "first_name": student.first_name,
                "email": student.email,
                "max_score": assignment.max_score,
            }
            try:
                sub = gradebook.find_submission(assignment.name, student.id)
            except MissingEntry:
                row.update(timestamp="", raw_score=0.0, late_submission_penalty=0.0, score=0.0)
            else:
                penalty = sub.late_submission_penalty
                row.update(
                    timestamp=sub.timestamp,
                    raw_score=sub.score,
                    late_submission_penalty=penalty,
                    score=max(0.0, sub.score - (penalty or 0.0)),
                )
            rows.append({k: "" if v is None else v for k, v in row.items()})
    return rows


@functools.cache
def _safe_csv_export():
    from nbgrader.plugins import CsvExportPlugin

    class SafeCsvExport(CsvExportPlugin):
        """``nbgrader export`` with nbgrader's columns, written by the csv module (a name with a comma
        stays one cell) and with every text cell that a spreadsheet would run as a formula escaped.

        Used when nbgrader_config.py says ``c.ExportApp.plugin_class =
        "grader.instructor.report.SafeCsvExport"``.
        """

        def export(self, gradebook) -> None:
            dest = self.to or "grades.csv"
            self.log.info("Exporting grades to %s", dest)
            rows = _nbgrader_rows(
                gradebook, [str(a) for a in self.assignment], [str(s) for s in self.student]
            )
            with open(dest, "w", newline="") as f:
                w = escape.CsvDictWriter(f, NBGRADER_COLUMNS, lineterminator="\n")
                w.writeheader()
                w.writerows(rows)

    return SafeCsvExport


def __getattr__(name: str):
    # nbgrader is imported only when the plugin is asked for (the report itself does not need it)
    if name == "SafeCsvExport":
        return _safe_csv_export()
    raise AttributeError(name)


def export(
    out_dir: Path | None = None, only_lessons: list[str] | None = None, roster: Path | None = None
) -> dict[str, Path]:
    """Write the grades CSV, the class report, its chart, its tables and the LMS import files
    (``grader.instructor.lms_export``; ``roster``: the class list to match); return their paths."""
    out_dir = out_dir or course.work_dir() / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    records = grading.load_records(only_lessons)
    rep = build(records)
    grades, rep.gradebook = grades_csv(out_dir / "grades.csv", records, only_lessons)
    records = as_decided(records)  # every file below reports the instructor's changes in the gradebook
    paths = {"grades": grades}
    paths["chart"] = chart(rep, out_dir / "class_report.png")
    paths["report"] = out_dir / "class_report.md"
    text = markdown(rep, paths["chart"].name)
    loose = sorted({r["isolation"] for r in records if str(r.get("isolation", "")).startswith("not sealed")})
    if loose:  # said first, in words no reader can miss
        n = sum(1 for r in records if str(r.get("isolation", "")).startswith("not sealed"))
        text = text.replace(
            "# Class report\n",
            f"# Class report\n\n**NOT SEALED: {n} submissions were graded without the operating-system seal "
            f"({'; '.join(escape.md_text(x) for x in loose)}): their code could read the instructor's files "
            f"and write the gradebook, so a grade listed as changed by hand may not be yours.**\n",
            1,
        )
    paths["report"].write_text(text)
    with (out_dir / "exercises.csv").open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(["lesson", "exercise", "submissions", "passed", "pass_rate", "mean_points", "max_points"])
        for s in rep.exercises:
            n = max(s.submissions, 1)
            w.writerow(
                [
                    s.lesson,
                    s.exercise,
                    s.submissions,
                    s.passed,
                    round(s.pass_rate, 4),
                    round(s.earned / n, 3),
                    s.points / n,
                ]
            )
    with (out_dir / "misconceptions.csv").open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(["exercise", "diagnosis", "students"])
        w.writerows(rep.misconceptions)
    with (out_dir / "submissions.csv").open("w", newline="") as f:
        w = escape.csv_writer(f)
        w.writerow(
            [
                "student",
                "lesson",
                "status",
                "score",
                "max_score",
                "seconds",
                "flags",
                "diagnoses",
                "notes",
                "isolation",
            ]
        )
        for r in records:
            diags = sorted({c["diagnosis"] for c in r.get("cells", []) if c.get("diagnosis")})
            w.writerow(
                [
                    r["student"],
                    r["lesson"],
                    r.get("status"),
                    r.get("score"),
                    r.get("max_score"),
                    r.get("seconds"),
                    " | ".join(r.get("flags", [])),
                    " | ".join(diags),
                    " | ".join(r.get("notes", [])),
                    r.get("isolation", ""),
                ]
            )
    for name in ("exercises", "misconceptions", "submissions"):
        paths[name] = out_dir / f"{name}.csv"
    from grader.instructor import lms_export

    paths.update(lms_export.write(out_dir, records, only_lessons, roster))
    paths["report_data"] = rep  # type: ignore[assignment]
    return paths
