"""Collect submissions the way an LMS hands them over, into the folders nbgrader reads.

Input: a zip export (or a folder) from Canvas, Moodle, Blackboard, or any
archive of per-student folders or name-encoded file names; zips inside zips
are opened too. Each notebook is matched to a student and to a lesson (from
its file name, or failing that from the nbgrader cell ids inside it). When a
student handed in a lesson several times, the latest attempt is kept.

Only the LMS is trusted: what a student uploaded (a zip's folders and file
names, the student's own file name after the LMS's prefix, a ``timestamp.txt``,
the times recorded inside the student's zip) never says who handed it in, nor
when.

Who handed it in is the outermost name the LMS layout gives, read from the
export's top down (past the folder that wraps a whole downloaded export, and
past lesson and attempt folders and names that name no one):

- Canvas: ``<sortablename>_<userid>_<submissionid>_<file>`` (``_LATE_`` after
  the name when Canvas marked it late);
- Moodle: ``<Full Name>_<id>_assignsubmission_file_`` folders, or the same
  prefix on the file name;
- Blackboard: ``<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file>``;
- per-student folders (or zips), or ``<student>_<lesson>.ipynb``.

Where a name fits more than one of these (the student's own file name after
Canvas's prefix may be shaped like a Blackboard or Moodle prefix), the prefix
that ends first is the LMS's: the rest is the student's own.

Everything below that name is the student's upload. A notebook whose upload
names another student of the class (a folder ``doejohn/`` in Jane's zip, a
file ``doejohn_05_softmax.ipynb`` or another LMS prefix) is not matched,
never placed for either of them.

With a roster (a CSV with any of name, sortable name, first/last name, email,
login/username, SIS ids, the LMS user id and a student id column), each file
is matched by the LMS user id, login or name it carries (the user id first: a
name is what the student chose in the LMS), and must match exactly one student;
the student id column names the submission folder. Without a roster the folder
is the name as the LMS writes it (Latin letters and digits); two uploaders whose names
give one folder (two students called Jane Smith) are not matched: use a roster.
A file that names no student (``Copy of 03_scaling.ipynb``) is not matched:
no student is ever made up.

When, from the LMS only: the time in a Blackboard file name (or in the name
of an attempt folder of the export's own), else a ``timestamp.txt`` beside the
notebook where the export's own folders hold it (nbgrader's
``<student>/<lesson>/`` folders; never one inside a student's zip nor among
the files a student handed in to an LMS: those are reported as ignored), else
the time the export's zip records for the upload (Canvas and Moodle record the
submission time there; for a notebook inside a student's zip, the time of the
student's zip). It is written to ``timestamp.txt`` for nbgrader's late
penalties. A file the LMS marked late is never recorded as on time: without a
later time it gets the lesson's due date plus one second.

Sizes are capped while reading, whatever a zip's headers claim: a notebook
over ``MAX_MEMBER_BYTES`` uncompressed, a zip inside the export over
``MAX_ARCHIVE_BYTES`` (it and all it holds), everything past
``MAX_TOTAL_BYTES`` for the whole export, and zips nested more than
``MAX_DEPTH`` deep are reported and left out; the rest of the class is still
collected.

Output: ``<work>/submitted/<student>/<lesson>/<lesson>.ipynb`` (plus
``timestamp.txt``), and a report in which every file of the export appears
exactly once: placed, superseded by a later attempt, ignored (with why:
checkpoint copies, system files, not a notebook, too large), or not matched
(with why). Nothing is silently dropped.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from pathlib import Path

from grader import course
from grader.classroom.jobs import one_line
from grader.instructor import escape
from grader.instructor.students import (
    Identity,
    Roster,
    export_wrappers,
    identify,
    in_export_structure,
    key,
    lesson_of,
    name_keys,
    names_another,
    parse_time,
    read_roster,
    slug,
)
from grader.instructor.uploads import TIMESTAMP, Entry, Outcome, read_export, system_file


@dataclass
class CollectReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def by(self, action: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.action == action]

    def write_csv(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = escape.csv_writer(f)  # file names come from students: no cell a spreadsheet runs
            w.writerow(["action", "student", "lesson", "source", "reason", "placed at"])
            for o in self.outcomes:
                w.writerow([o.action, o.student, o.lesson, o.source, o.reason, o.dest])

    def format(self) -> str:
        lines = [
            f"Placed {len(self.by('placed'))} submissions; {len(self.by('superseded'))} older attempts "
            f"superseded; {len(self.by('ignored'))} files ignored; {len(self.by('unmatched'))} not matched."
        ]
        for action, title in (("unmatched", "Not matched (fix and collect again)"), ("ignored", "Ignored")):
            rows = self.by(action)
            if rows:
                lines.append(f"{title}:")
                lines += [one_line(f"  {o.source}: {o.reason}") for o in rows]  # names the students chose
        return "\n".join(lines)


# ------------------------------------------------------------------ collecting


def due_date(lesson: str) -> datetime.datetime | None:
    """The lesson's due date in the course's gradebook (UTC), if one was set."""
    import sqlite3

    db = course.work_dir() / "gradebook.db"
    if not db.exists():
        return None
    try:
        with sqlite3.connect(db) as con:
            row = con.execute("SELECT duedate FROM assignment WHERE name = ?", (lesson,)).fetchone()
    except sqlite3.Error:
        return None
    return parse_time(row[0]) if row and row[0] else None


def _existing_time(folder: Path) -> datetime.datetime | None:
    ts = folder / "timestamp.txt"
    if ts.exists():
        return parse_time(ts.read_text())
    return None


def _students_by_key(roster: Roster | None, idents: list[Identity | None]) -> dict[str, set[str]]:
    """Every key a student of the class goes by -> their ids: the roster's, else this export's uploaders'."""
    found: dict[str, set[str]] = {}
    if roster is not None:
        for table in (roster.ids, roster.derived):
            for k, sids in table.items():
                found.setdefault(k, set()).update(sids)
        return found
    for ident in idents:
        if ident is not None and ident.student:
            for k in ident.keys or name_keys(ident.student):
                found.setdefault(k, set()).add(slug(ident.student))
    return found


def _shared_folders(idents: list[Identity | None]) -> set[str]:
    """Folders two uploaders of the export would share without a roster: the same name, slugged, for
    different LMS user ids (two students called Jane Smith) or different names ('José Smith', 'Jos Smith')."""
    who: dict[str, set[str]] = {}
    for ident in idents:
        if ident is not None and ident.student:
            uploader = ident.keys[0] if ident.layout == "lms" and ident.keys else key(ident.student)
            who.setdefault(slug(ident.student), set()).add(uploader)
    return {folder for folder, uploaders in who.items() if len(uploaders) > 1}


def collect(
    export: Path,
    roster: Path | None = None,
    lesson_ids: list[str] | None = None,
    dest_root: Path | None = None,
    dry_run: bool = False,
) -> CollectReport:
    """Place every notebook of an export where nbgrader expects it; report every file."""
    lesson_ids = lesson_ids or course.lessons()
    dest_root = dest_root or course.work_dir() / "submitted"
    names = read_roster(roster) if roster else None
    report = CollectReport()
    entries, bad = read_export(export)
    report.outcomes += bad
    wrappers = export_wrappers(entries, lesson_ids)
    idents = [
        identify(e, lesson_ids, wrappers)
        if e.path.suffix.lower() == ".ipynb" or e.path.name == TIMESTAMP
        else None
        for e in entries
    ]
    students = _students_by_key(names, idents)
    shared = _shared_folders(idents) if names is None else set()
    # timestamp.txt files by the folder they lie in, and whether the export's own folders hold them
    stamps: dict[tuple, tuple[Entry, bool]] = {}
    for e, ident in zip(entries, idents):
        if e.path.name == TIMESTAMP and ident is not None:
            stamps[(tuple(e.outer), e.path.parent)] = (e, in_export_structure(e, ident))
    candidates: dict[tuple[str, str], list[tuple[tuple, Entry, Identity]]] = {}
    for entry, ident in zip(entries, idents):
        path = entry.path
        if system_file(path):
            report.outcomes.append(Outcome(entry.source, "ignored", "system file"))
            continue
        if ".ipynb_checkpoints" in path.parts or path.name.endswith("-checkpoint.ipynb"):
            report.outcomes.append(
                Outcome(entry.source, "ignored", "Jupyter checkpoint copy (not the saved notebook)")
            )
            continue
        if path.suffix.lower() != ".ipynb" or ident is None:
            if path.name == TIMESTAMP and stamps[(tuple(entry.outer), path.parent)][1]:
                report.outcomes.append(
                    Outcome(entry.source, "ignored", "timestamp file (read with its notebook)")
                )
            elif path.name == TIMESTAMP:
                report.outcomes.append(
                    Outcome(
                        entry.source,
                        "ignored",
                        "timestamp.txt inside a student's upload: not read (times come from the LMS only)",
                    )
                )
            else:
                report.outcomes.append(
                    Outcome(entry.source, "ignored", f"not a notebook ({path.suffix or 'no extension'})")
                )
            continue
        if not ident.student:
            report.outcomes.append(
                Outcome(
                    entry.source, "unmatched", "cannot tell whose it is: no student folder or LMS file name"
                )
            )
            continue
        student = slug(ident.student)
        if student in shared:
            why = f"{student}/ would hold the work of more than one student of that name: run collect with --roster"
            report.outcomes.append(Outcome(entry.source, "unmatched", why, ident.student))
            continue
        if names is not None:
            sid, why = names.find(ident.keys or name_keys(ident.student))
            if sid is None:
                report.outcomes.append(
                    Outcome(entry.source, "unmatched", f"{ident.student!r}: {why}", ident.student)
                )
                continue
            student = sid
        if other := names_another(ident, student, students, lesson_ids):
            report.outcomes.append(
                Outcome(
                    entry.source,
                    "unmatched",
                    f"uploaded by {ident.student} but names {other} (another student): not placed",
                    student,
                )
            )
            continue
        lesson, how = lesson_of(entry, ident, lesson_ids)
        if lesson is None:
            report.outcomes.append(Outcome(entry.source, "unmatched", how, student))
            continue
        # a timestamp.txt beside the notebook (nbgrader's own exchange format) says when, if the
        # export's own folders hold it; the student's own never does
        stamp, trusted = stamps.get((tuple(entry.outer), path.parent), (None, False))
        if stamp is not None and trusted and ident.attempt_time is None:
            ident.attempt_time = parse_time(stamp.data.decode(errors="replace"))
            ident.time_from = "timestamp.txt" if ident.attempt_time else ""
        if ident.attempt_time is None and ident.lms_time is not None:
            ident.attempt_time, ident.time_from = ident.lms_time, "the zip"
        if stamp is not None and not trusted:
            ident.note = "; the timestamp.txt beside it is the student's own: not read"
        order = (
            ident.attempt_time or datetime.datetime.min,
            ident.attempt_number,
            entry.mtime or datetime.datetime.min,
            entry.source,
        )
        candidates.setdefault((student, lesson), []).append((order, entry, ident))
    for (student, lesson), found in sorted(candidates.items()):
        found.sort(key=lambda t: t[0])
        *older, (order, entry, ident) = found
        for _, e, _ in older:
            report.outcomes.append(
                Outcome(e.source, "superseded", f"a later attempt was kept: {entry.source}", student, lesson)
            )
        folder = dest_root / student / lesson
        dest = folder / f"{lesson}.ipynb"
        existing = _existing_time(folder)
        if existing and ident.attempt_time and existing > ident.attempt_time:
            report.outcomes.append(
                Outcome(
                    entry.source,
                    "superseded",
                    f"a later submission was already collected ({existing})",
                    student,
                    lesson,
                )
            )
            continue
        reason = f"lesson from the {lesson_of(entry, ident, [lesson])[1]}"
        if ident.late:
            reason += "; marked late by the LMS"
            due = due_date(lesson)
            if due is not None and (ident.attempt_time is None or ident.attempt_time <= due):
                ident.attempt_time = due + datetime.timedelta(seconds=1)
                ident.time_from = "the due date (the LMS says it is late)"
            elif ident.attempt_time is None:
                reason += ", but neither the export nor the lesson has a time: no late penalty"
        if ident.attempt_time:
            reason += f"; handed in {ident.attempt_time:%Y-%m-%d %H:%M:%S} (from {ident.time_from})"
        reason += ident.note
        if not dry_run:
            folder.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(entry.data)
            ts = folder / "timestamp.txt"
            if ident.attempt_time:
                ts.write_text(ident.attempt_time.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
            elif ts.exists():
                ts.unlink()
        report.outcomes.append(Outcome(entry.source, "placed", reason, student, lesson, str(dest)))
    return report
