"""Collect submissions the way an LMS hands them over, into the folders nbgrader reads.

Input: a zip export (or a folder) from Canvas, Moodle, Blackboard, or any
archive of per-student folders or name-encoded file names; zips inside zips
are opened too. Each notebook is matched to a student (from its folder or
file name, optionally through a roster) and to a lesson (from its file name,
or failing that from the nbgrader cell ids inside it). When a student handed
in a lesson several times, the latest attempt is kept.

Output: ``<work>/submitted/<student>/<lesson>/<lesson>.ipynb`` (plus
``timestamp.txt`` when the export says when it was handed in, which nbgrader
uses for late penalties), and a report in which every file of the export
appears exactly once: placed, superseded by a later attempt, ignored (with
why: checkpoint copies, system files, not a notebook), or not matched (with
why). Nothing is silently dropped.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader import course

SYSTEM_FILES = {".ds_store", "thumbs.db", "desktop.ini", "icon\r"}
MAX_DEPTH = 4  # zips inside zips inside zips ...


@dataclass
class Entry:
    """One file of the export, with what it says about its owner."""

    source: str  # where it was, e.g. "export.zip!Jane Smith_123_assignsubmission_file_/hw.ipynb"
    path: PurePosixPath  # its path inside its archive (folders included)
    data: bytes
    mtime: datetime.datetime | None = None
    outer: list[str] = field(default_factory=list)  # names of the zips it was found in (innermost last)


@dataclass
class Identity:
    student: str | None = None  # as the LMS names them
    attempt_time: datetime.datetime | None = None
    attempt_number: int = 0
    late: bool = False
    filename: str = ""  # the student's own file name (LMS prefixes removed)


@dataclass
class Outcome:
    source: str
    action: str  # "placed", "superseded", "ignored", "unmatched"
    reason: str = ""
    student: str = ""
    lesson: str = ""
    dest: str = ""


@dataclass
class CollectReport:
    outcomes: list[Outcome] = field(default_factory=list)

    def by(self, action: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.action == action]

    def write_csv(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            w = csv.writer(f)
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
                lines += [f"  {o.source}: {o.reason}" for o in rows]
        return "\n".join(lines)


# ------------------------------------------------------------------ reading the export


def _walk_zip(
    data: bytes, source: str, outer: list[str], depth: int, out: list[Entry], bad: list[Outcome]
) -> None:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as e:
        bad.append(Outcome(source, "unmatched", f"not a readable zip file ({e})"))
        return
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            where = f"{source}!{info.filename}"
            try:
                content = zf.read(info)
            except Exception as e:  # noqa: BLE001 - a damaged member
                bad.append(Outcome(where, "unmatched", f"could not be extracted ({e})"))
                continue
            mtime = datetime.datetime(*info.date_time) if info.date_time[0] >= 1980 else None
            path = PurePosixPath(info.filename)
            if path.suffix.lower() == ".zip" and not _system_file(path):
                if depth >= MAX_DEPTH:
                    bad.append(Outcome(where, "unmatched", "zip nested too deeply"))
                else:
                    _walk_zip(content, where, [*outer, *path.parts], depth + 1, out, bad)
                continue
            out.append(Entry(where, path, content, mtime, list(outer)))


def read_export(export: Path) -> tuple[list[Entry], list[Outcome]]:
    """Every file of a zip export or folder (nested zips opened), and the ones that could not be read."""
    entries: list[Entry] = []
    bad: list[Outcome] = []
    if export.is_dir():
        for p in sorted(export.rglob("*")):
            if not p.is_file():
                continue
            rel = PurePosixPath(p.relative_to(export).as_posix())
            mtime = datetime.datetime.fromtimestamp(p.stat().st_mtime)
            if p.suffix.lower() == ".zip":
                _walk_zip(p.read_bytes(), str(rel), list(rel.parts), 1, entries, bad)
            else:
                entries.append(Entry(str(rel), rel, p.read_bytes(), mtime, []))
    else:
        _walk_zip(export.read_bytes(), export.name, [], 0, entries, bad)
    return entries, bad


# ------------------------------------------------------------------ who handed it in

CANVAS = re.compile(r"^(?P<name>[A-Za-z0-9\-]+?)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_\w+?_?$")
BLACKBOARD = re.compile(
    r"^(?P<assignment>.+?)_(?P<user>[^_]+)_attempt_(?P<ts>\d{4}-\d{2}-\d{2}-\d{2}-\d{2}-\d{2})(?:_(?P<file>.+))?$"
)
ATTEMPT_SUFFIX = re.compile(r"^(?P<stem>.+?)[-_ ]\(?(?P<n>\d{1,2})\)?$")
ATTEMPT_WORD = re.compile(r"(?:attempt|try|version|submission|v)[-_ ]?(\d+)", re.I)
ISO_TIME = re.compile(r"(\d{4})-?(\d{2})-?(\d{2})[T_ -]?(\d{2})[-:]?(\d{2})[-:]?(\d{2})")


def _system_file(path: PurePosixPath) -> bool:
    return path.name.lower() in SYSTEM_FILES or "__MACOSX" in path.parts or path.name.startswith("._")


def slug(name: str) -> str:
    """A folder-safe student id: 'Jane Smith' -> 'jane_smith'."""
    s = re.sub(r"[^A-Za-z0-9]+", "_", name.strip()).strip("_").lower()
    return s or "unknown"


def identify(entry: Entry, lesson_ids: list[str]) -> Identity:
    """Read the student, attempt and time out of an entry's folder and file names."""
    ident = Identity(filename=entry.path.name)
    # the innermost folder or zip that names someone wins
    names = [*entry.outer, *entry.path.parts[:-1]]
    for part in names:
        stem = re.sub(r"\.zip$", "", part, flags=re.I)
        if m := MOODLE.match(stem):
            ident.student = m.group("name")
        elif m := BLACKBOARD.match(stem):
            ident.student = m.group("user")
            ident.attempt_time = _parse_time(m.group("ts"))
        elif m := CANVAS.match(stem):
            ident.student, ident.late = m.group("name"), bool(m.group("late"))
        elif ATTEMPT_WORD.fullmatch(stem) or ISO_TIME.search(stem):
            if n := ATTEMPT_WORD.search(stem):
                ident.attempt_number = max(ident.attempt_number, int(n.group(1)))
            if t := ISO_TIME.search(stem):
                ident.attempt_time = _parse_time(t.group(0))
        elif _lesson_in(stem, lesson_ids) or stem.lower() in ("submitted", "submissions", "export", "files"):
            continue
        elif ident.student is None or part in entry.path.parts[:-1]:
            # a plain folder named after the student (per-student folders)
            if not _is_export_root(part, names):
                ident.student = stem
    # the file name itself can carry everything (Canvas, Blackboard, "<student>_<lesson>.ipynb")
    name = entry.path.name
    stem = name[: -len(entry.path.suffix)] if entry.path.suffix else name
    if m := BLACKBOARD.match(stem):
        ident.student = m.group("user")
        ident.attempt_time = _parse_time(m.group("ts"))
        ident.filename = (m.group("file") or "") + entry.path.suffix
    elif m := CANVAS.match(stem):
        ident.student, ident.late = m.group("name"), bool(m.group("late"))
        ident.filename = m.group("file") + entry.path.suffix
    elif ident.student is None:
        for lesson in lesson_ids:
            for pattern in (rf"^(?P<s>.+?)[-_ .]+{lesson}$", rf"^{lesson}[-_ .]+(?P<s>.+)$"):
                if m := re.match(pattern, _norm(stem)):
                    ident.student = m.group("s")
                    ident.filename = f"{lesson}{entry.path.suffix}"
    # "-1", "(2)" after the lesson's name: a later attempt of the same file
    fstem = ident.filename.rsplit(".", 1)[0]
    if (m := ATTEMPT_SUFFIX.match(fstem)) and _lesson_in(m.group("stem"), lesson_ids):
        ident.attempt_number = max(ident.attempt_number, int(m.group("n")))
    if ident.attempt_time is None and (t := ISO_TIME.search(fstem)):
        ident.attempt_time = _parse_time(t.group(0))
    return ident


def _is_export_root(part: str, names: list[str]) -> bool:
    """The top folder of an export that wraps per-student folders ("Assignment 1 Download")."""
    return len(names) > 1 and part == names[0] and any(MOODLE.match(n) or CANVAS.match(n) for n in names[1:])


def _parse_time(text: str) -> datetime.datetime | None:
    m = ISO_TIME.search(text)
    if not m:
        return None
    try:
        return datetime.datetime(*(int(g) for g in m.groups()))
    except ValueError:
        return None


def _norm(text: str) -> str:
    return re.sub(r"[\s\-\.]+", "_", text.strip().lower())


def _lesson_in(text: str, lesson_ids: list[str]) -> str | None:
    """The lesson a file or folder name points at: its id, or its topic word, or 'lesson 3'."""
    t = _norm(text)
    for lesson in lesson_ids:
        if lesson in t:
            return lesson
    for lesson in lesson_ids:
        num, topic = lesson.split("_", 1)
        if re.search(rf"(^|_){re.escape(topic)}($|_)", t) or re.search(
            rf"(^|_)(lesson|lab|hw|ps|assignment|notebook)_?0*{int(num)}($|_)", t
        ):
            return lesson
    return None


def lesson_of(entry: Entry, ident: Identity, lesson_ids: list[str]) -> tuple[str | None, str]:
    """(lesson, how it was recognised) from the file name, else from the notebook's cell ids."""
    by_name = _lesson_in(ident.filename or entry.path.name, lesson_ids)
    if by_name:
        return by_name, "file name"
    try:
        nb = json.loads(entry.data.decode("utf-8"))
        ids = {
            c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            for c in nb.get("cells", [])
            if isinstance(c, dict)
        }
    except (ValueError, UnicodeDecodeError, AttributeError):
        return None, "the file name names no lesson and the file is not readable as a notebook"
    from grader.classroom.lessons import lesson_of_grade_ids

    found = lesson_of_grade_ids({i for i in ids if i})
    if found in lesson_ids:
        return found, "cells inside"
    return None, "the file name names no lesson and no lesson's cells are inside"


# ------------------------------------------------------------------ the roster


def read_roster(path: Path) -> dict[str, str]:
    """LMS identities -> student ids, from a CSV with an ``id`` column and any of
    ``name``, ``email``, ``username``, ``lms_id``, ``sortable_name`` (matched case-insensitively)."""
    out: dict[str, str] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            row = {k.strip().lower(): (v or "").strip() for k, v in row.items() if k}
            sid = row.get("id") or row.get("student_id")
            if not sid:
                continue
            for key, value in row.items():
                if value:
                    out[_norm(value)] = sid
                    out[slug(value)] = sid
                    if key == "email":
                        out[_norm(value.split("@")[0])] = sid
            out[_norm(sid)] = sid
    return out


# ------------------------------------------------------------------ collecting


def _existing_time(folder: Path) -> datetime.datetime | None:
    ts = folder / "timestamp.txt"
    if ts.exists():
        return _parse_time(ts.read_text())
    return None


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
    candidates: dict[tuple[str, str], list[tuple[tuple, Entry, Identity]]] = {}
    for entry in entries:
        path = entry.path
        if _system_file(path):
            report.outcomes.append(Outcome(entry.source, "ignored", "system file"))
            continue
        if ".ipynb_checkpoints" in path.parts or path.name.endswith("-checkpoint.ipynb"):
            report.outcomes.append(
                Outcome(entry.source, "ignored", "Jupyter checkpoint copy (not the saved notebook)")
            )
            continue
        if path.suffix.lower() != ".ipynb":
            if path.name == "timestamp.txt":
                report.outcomes.append(
                    Outcome(entry.source, "ignored", "timestamp file (read with its notebook)")
                )
            else:
                report.outcomes.append(
                    Outcome(entry.source, "ignored", f"not a notebook ({path.suffix or 'no extension'})")
                )
            continue
        ident = identify(entry, lesson_ids)
        if not ident.student:
            report.outcomes.append(
                Outcome(
                    entry.source, "unmatched", "cannot tell whose it is: no student folder or LMS file name"
                )
            )
            continue
        student = slug(ident.student)
        if names is not None:
            sid = names.get(_norm(ident.student)) or names.get(student)
            if sid is None:
                report.outcomes.append(
                    Outcome(
                        entry.source, "unmatched", f"{ident.student!r} is not on the roster", ident.student
                    )
                )
                continue
            student = sid
        lesson, how = lesson_of(entry, ident, lesson_ids)
        if lesson is None:
            report.outcomes.append(Outcome(entry.source, "unmatched", how, student))
            continue
        # a timestamp.txt next to the notebook (nbgrader's own exchange format) says when
        stamp = next(
            (
                e
                for e in entries
                if e.path.parent == path.parent and e.path.name == "timestamp.txt" and e.outer == entry.outer
            ),
            None,
        )
        if stamp is not None and ident.attempt_time is None:
            ident.attempt_time = _parse_time(stamp.data.decode(errors="replace"))
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
