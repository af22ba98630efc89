"""Collect submissions the way an LMS hands them over, into the folders nbgrader reads.

Input: a zip export (or a folder) from Canvas, Moodle, Blackboard, or any
archive of per-student folders or name-encoded file names; zips inside zips
are opened too. Each notebook is matched to a student and to a lesson (from
its file name, or failing that from the nbgrader cell ids inside it). When a
student handed in a lesson several times, the latest attempt is kept.

Who handed it in, by layout:

- Canvas: ``<sortablename>_<userid>_<submissionid>_<file>`` (``_LATE_`` after
  the name when Canvas marked it late);
- Moodle: ``<Full Name>_<id>_assignsubmission_file_`` folders, or the same
  prefix on the file name;
- Blackboard: ``<assignment>_<username>_attempt_<YYYY-MM-DD-HH-MM-SS>_<file>``;
- per-student folders, or ``<student>_<lesson>.ipynb``.

With a roster (a CSV with any of name, sortable name, first/last name, email,
login/username, SIS ids, the LMS user id and a student id column), each file
is matched by the LMS user id, login or name it carries, and must match
exactly one student; the student id column names the submission folder.
A file that names no student (``Copy of 03_scaling.ipynb``) is not matched:
no student is ever made up.

When: a time in the file name (Blackboard), a ``timestamp.txt`` beside the
notebook, or else the file's time inside the zip (Canvas and Moodle record the
submission time there), written to ``timestamp.txt`` for nbgrader's late
penalties. A file the LMS marked late is never recorded as on time: without a
later time it gets the lesson's due date plus one second.

Output: ``<work>/submitted/<student>/<lesson>/<lesson>.ipynb`` (plus
``timestamp.txt``), and a report in which every file of the export appears
exactly once: placed, superseded by a later attempt, ignored (with why:
checkpoint copies, system files, not a notebook), or not matched (with why).
Nothing is silently dropped.
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
    zipped: bool = False  # its mtime is the one recorded in a zip (an LMS's submission time)


@dataclass
class Identity:
    student: str | None = None  # as the LMS names them
    attempt_time: datetime.datetime | None = None
    attempt_number: int = 0
    late: bool = False
    filename: str = ""  # the student's own file name (LMS prefixes removed)
    keys: list[str] = field(default_factory=list)  # what identifies them on a roster, strongest first
    time_from: str = ""  # where attempt_time was read


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
            mtime = datetime.datetime(*info.date_time) if info.date_time > (1980, 1, 1, 0, 0, 0) else None
            path = PurePosixPath(info.filename)
            if path.suffix.lower() == ".zip" and not _system_file(path):
                if depth >= MAX_DEPTH:
                    bad.append(Outcome(where, "unmatched", "zip nested too deeply"))
                else:
                    _walk_zip(content, where, [*outer, *path.parts], depth + 1, out, bad)
                continue
            out.append(Entry(where, path, content, mtime, list(outer), zipped=mtime is not None))


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

CANVAS = re.compile(
    r"^(?P<name>[^\W_]+(?:-[^\W_]+)*?)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$"
)
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_\w+?_?$")
MOODLE_FILE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_(?:file|onlinetext)_(?P<file>.+)$")
# words that make up a file name without naming anyone ("Copy of 03_scaling", "03_scaling final")
NOT_A_NAME = {
    "copy",
    "of",
    "untitled",
    "final",
    "my",
    "new",
    "draft",
    "version",
    "submission",
    "submit",
    "homework",
    "hw",
    "lesson",
    "lab",
    "notebook",
    "assignment",
    "solution",
    "solutions",
    "answers",
    "done",
    "complete",
    "completed",
    "finished",
    "student",
    "kopie",
    "copie",
    "van",
    "de",
    "ipynb",
    "download",
    "downloads",
    "export",
    "submissions",
    "files",
    "folder",
}
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


def key(text: str) -> str:
    """A roster key: lower-case letters and digits only ('Smith, Jane' -> 'smithjane')."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _name_keys(name: str) -> list[str]:
    """A person's name as an LMS may write it: 'Jane Smith', 'Smith, Jane', 'smithjane'."""
    keys = [key(name)]
    if "," in name:
        last, first = name.split(",", 1)
        keys.append(key(f"{first} {last}"))
    elif len(parts := name.split()) > 1:
        keys.append(key(f"{parts[-1]} {' '.join(parts[:-1])}"))
    return [k for k in dict.fromkeys(keys) if k]


def names_someone(text: str) -> bool:
    """Whether a piece of a file name can be a student's name ('Copy of', '(1)', 'final' cannot)."""
    words = [w for w in re.split(r"[\W_]+", text.casefold()) if w]
    return any(
        any(c.isalpha() for c in w) and w not in NOT_A_NAME and not ATTEMPT_WORD.fullmatch(w) for w in words
    )


def identify(entry: Entry, lesson_ids: list[str]) -> Identity:
    """Read the student, attempt and time out of an entry's folder and file names."""
    ident = Identity(filename=entry.path.name)
    # the innermost folder or zip that names someone wins
    names = [*entry.outer, *entry.path.parts[:-1]]
    for part in names:
        stem = re.sub(r"\.zip$", "", part, flags=re.I)
        if m := MOODLE.match(stem):
            ident.student = m.group("name")
            ident.keys = [*_name_keys(m.group("name")), key(m.group("uid"))]
        elif m := BLACKBOARD.match(stem):
            ident.student = m.group("user")
            ident.keys = [key(m.group("user"))]
            ident.attempt_time = _parse_time(m.group("ts"))
        elif m := CANVAS.match(stem):
            ident.student, ident.late = m.group("name"), bool(m.group("late"))
            ident.keys = [key(m.group("uid")), key(m.group("name"))]
        elif ATTEMPT_WORD.fullmatch(stem) or ISO_TIME.search(stem):
            if n := ATTEMPT_WORD.search(stem):
                ident.attempt_number = max(ident.attempt_number, int(n.group(1)))
            if t := ISO_TIME.search(stem):
                ident.attempt_time = _parse_time(t.group(0))
        elif _lesson_in(stem, lesson_ids) or stem.lower() in ("submitted", "submissions", "export", "files"):
            continue
        elif ident.student is None or part in entry.path.parts[:-1]:
            # a plain folder named after the student (per-student folders)
            if not _is_export_root(part, names) and names_someone(stem):
                ident.student = stem
                ident.keys = _name_keys(stem)
    # the file name itself can carry everything (Canvas, Moodle, Blackboard, "<student>_<lesson>.ipynb")
    name = entry.path.name
    stem = name[: -len(entry.path.suffix)] if entry.path.suffix else name
    if m := BLACKBOARD.match(stem):
        ident.student = m.group("user")
        ident.keys = [key(m.group("user"))]
        ident.attempt_time = _parse_time(m.group("ts"))
        ident.filename = (m.group("file") or "") + entry.path.suffix
    elif m := MOODLE_FILE.match(stem):
        ident.student = m.group("name")
        ident.keys = [*_name_keys(m.group("name")), key(m.group("uid"))]
        ident.filename = m.group("file") + entry.path.suffix
    elif m := CANVAS.match(stem):
        ident.student, ident.late = m.group("name"), bool(m.group("late"))
        ident.keys = [key(m.group("uid")), key(m.group("name"))]
        ident.filename = m.group("file") + entry.path.suffix
    elif ident.student is None:
        for lesson in lesson_ids:
            for pattern in (rf"^(?P<s>.+?)[-_ .]+{lesson}$", rf"^{lesson}[-_ .]+(?P<s>.+)$"):
                m = re.match(pattern, _norm(stem))
                if m and names_someone(m.group("s")):
                    ident.student = m.group("s")
                    ident.keys = _name_keys(m.group("s").replace("_", " "))
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


# roster columns, by what they hold (headers compared lower-case, spaces and underscores alike)
# the first of these a row fills names the student's folder (an email: its part before the @)
ID_COLUMNS = ["student id", "nbgrader id", "id", "sis login id", "login id", "login", "username", "user name"]
ID_COLUMNS += ["email", "email address", "sis user id", "user id"]
NAME_COLUMNS = {"name", "full name", "student", "student name", "display name", "sortable name"}
EMAIL_COLUMNS = {"email", "email address", "e mail"}
KEY_COLUMNS = NAME_COLUMNS | EMAIL_COLUMNS | set(ID_COLUMNS)
KEY_COLUMNS |= {"canvas user id", "canvas id", "lms id", "lms user id", "sis id", "id number", "idnumber"}
KEY_COLUMNS |= {"moodle id", "participant id", "user", "short name", "integration id"}


@dataclass
class Roster:
    """Who is in the class: every key a student can be recognised by -> their student ids."""

    ids: dict[str, set[str]] = field(default_factory=dict)  # keys as the roster writes them
    derived: dict[str, set[str]] = field(default_factory=dict)  # "Smith, Jane" from "Jane Smith" ...

    def add(self, keys: list[str], sid: str, derived: bool = False) -> None:
        for k in keys:
            if k:
                (self.derived if derived else self.ids).setdefault(k, set()).add(sid)

    def find(self, keys: list[str]) -> tuple[str | None, str]:
        """(student id, '') for the first key that names exactly one student; else (None, why)."""
        for k in keys:
            found = self.ids.get(k) or self.derived.get(k)
            if found and len(found) == 1:
                return next(iter(found)), ""
            if found:
                return None, f"{k!r} matches several students on the roster ({', '.join(sorted(found))})"
        return None, "not on the roster"


def _header(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


def read_roster(path: Path) -> Roster:
    """Every student of a roster CSV and the keys they go by.

    Recognised columns (any case; spaces or underscores): a student id (``student id``, ``id``,
    ``login``, ``username``, ``sis login id`` ...: the first present names the folder), names
    (``name``, ``sortable name`` such as "Smith, Jane", ``first name`` + ``last name``), ``email``,
    and LMS ids (``user id``, ``canvas user id``, ``sis user id``, ``lms id`` ...). Canvas's own
    gradebook export (Student, ID, SIS User ID, SIS Login ID) works as it is.
    """
    roster = Roster()
    with path.open(newline="", encoding="utf-8-sig") as f:
        for raw in csv.DictReader(f):
            row = {_header(k): (v or "").strip() for k, v in raw.items() if k}
            if "points possible" in " ".join(row.values()).lower():
                continue  # Canvas's second header row
            first, last = row.get("first name", ""), row.get("last name", "") or row.get("surname", "")
            if first or last:
                row.setdefault("full name", f"{first} {last}".strip())
            column = next((c for c in ID_COLUMNS if row.get(c)), None)
            sid = row[column] if column else ""
            if column in EMAIL_COLUMNS:
                sid = sid.split("@")[0]
            if not sid:
                name = next((row[c] for c in NAME_COLUMNS | {"full name"} if row.get(c)), "")
                sid = slug(name) if name else ""
            if not sid:
                continue
            keys, derived = [key(sid)], []
            for column, value in row.items():
                if not value or column not in KEY_COLUMNS | {"full name"}:
                    continue
                if column in NAME_COLUMNS | {"full name"}:
                    keys.append(key(value))
                    derived += _name_keys(value)[1:]
                elif column in EMAIL_COLUMNS:
                    keys += [key(value), key(value.split("@")[0])]
                else:
                    keys.append(key(value))
            roster.add(list(dict.fromkeys(keys)), sid)
            roster.add(derived, sid, derived=True)
    return roster


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
    return _parse_time(row[0]) if row and row[0] else None


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
            sid, why = names.find(ident.keys or _name_keys(ident.student))
            if sid is None:
                report.outcomes.append(
                    Outcome(entry.source, "unmatched", f"{ident.student!r}: {why}", ident.student)
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
        ident.time_from = "the file name" if ident.attempt_time else ""
        if stamp is not None and ident.attempt_time is None:
            ident.attempt_time = _parse_time(stamp.data.decode(errors="replace"))
            ident.time_from = "timestamp.txt" if ident.attempt_time else ""
        if ident.attempt_time is None and entry.zipped:
            ident.attempt_time, ident.time_from = entry.mtime, "the zip"
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
