"""Whose upload each file of an LMS export is, for which lesson, and when the LMS says it came.

The outermost name the LMS layout gives says who handed a file in (an LMS's prefix, a per-student
folder or zip, ``<student>_<lesson>.ipynb``); the names below it are the student's own upload and
never say who nor when (``identify``, ``names_another``). A roster (``read_roster``) names the
class. ``collect``'s docstring tells the whole of collecting.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.instructor.uploads import Entry, system_file, wanted


@dataclass
class Identity:
    student: str | None = None  # as the LMS names them
    attempt_time: datetime.datetime | None = None
    attempt_number: int = 0
    late: bool = False
    filename: str = ""  # the student's own file name (LMS prefixes removed)
    keys: list[str] = field(default_factory=list)  # what identifies them on a roster, strongest first
    time_from: str = ""  # where attempt_time was read
    at: int = -1  # the index in the entry's chain of the name that says who uploaded it (-1: none does)
    layout: str = ""  # what that name is: "lms", "folder", "zip" (a per-student one) or "file"
    level: int = 0  # the entry's level that holds that name
    inside: list[tuple[str, bool]] = field(default_factory=list)  # (stem, is a file) of the names below
    lms_time: datetime.datetime | None = None  # the time the export's zip records for the upload
    note: str = ""  # what the report adds about the time


# ------------------------------------------------------------------ who handed it in

CANVAS = re.compile(
    r"^(?P<name>[^\W_]+(?:-[^\W_]+)*?)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$"
)
# a folder: the LMS adds "_<id>_assignsubmission_file_" at the end, after a name its user may choose
MOODLE = re.compile(r"^(?P<name>.+)_(?P<uid>\d+)_assignsubmission_[a-z]+_?$")
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


def slug(name: str) -> str:
    """A folder-safe student id: 'Jane Smith' -> 'jane_smith'; a name with no Latin letter or digit
    ('王伟') -> 'student_' and a digest of it, so that two such names share no folder."""
    s = re.sub(r"[^A-Za-z0-9]+", "_", name.strip()).strip("_").lower()
    return s or "student_" + hashlib.sha256(name.strip().encode()).hexdigest()[:8]


def key(text: str) -> str:
    """A roster key: lower-case letters and digits only ('Smith, Jane' -> 'smithjane')."""
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def name_keys(name: str) -> list[str]:
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


@dataclass
class LmsName:
    """What an LMS's prefix on a file or folder name says."""

    student: str
    keys: list[str]
    late: bool = False
    time: datetime.datetime | None = None  # Blackboard's attempt time
    file: str = ""  # what follows the prefix: the student's own name for the file


def lms_name(stem: str, is_file: bool) -> LmsName | None:
    """The student an LMS's prefix names (Moodle folders, Blackboard, Moodle files, Canvas), if any.

    What follows a prefix is the student's own file name, which may be shaped like another LMS's
    prefix (``smithjane_12345_901_x_doejohn_attempt_2026-12-30-23-59-59_hw`` is Jane's upload to
    Canvas, not John's to Blackboard): where several fit, the prefix that ends first is the LMS's.
    """
    found: list[tuple[int, LmsName]] = []
    if not is_file and (m := MOODLE.match(stem)):
        found.append((m.end(), LmsName(m["name"], [key(m["uid"]), *name_keys(m["name"])])))
    if m := BLACKBOARD.match(stem):
        when = parse_time(m["ts"])
        found.append((m.end("ts"), LmsName(m["user"], [key(m["user"])], time=when, file=m["file"] or "")))
    if is_file and (m := MOODLE_FILE.match(stem)):
        found.append(
            (m.start("file"), LmsName(m["name"], [key(m["uid"]), *name_keys(m["name"])], file=m["file"]))
        )
    if m := CANVAS.match(stem):
        named = LmsName(m["name"], [key(m["uid"]), key(m["name"])], late=bool(m["late"]), file=m["file"])
        found.append((m.start("file"), named))
    return min(found, key=lambda f: f[0])[1] if found else None


def _stem(name: str, is_file: bool) -> str:
    """A name without its extension when it is a file's ('hw.zip' -> 'hw'); a folder's as it is."""
    suffix = PurePosixPath(name).suffix if is_file else ""
    return name[: -len(suffix)] if suffix else name


def _student_and_lesson(stem: str, lesson_ids: list[str]) -> tuple[str, str] | None:
    """('jane_smith', lesson) for a file named '<student>_<lesson>' or '<lesson>_<student>'."""
    for lesson in lesson_ids:
        for pattern in (rf"^(?P<s>.+?)[-_ .]+{lesson}$", rf"^{lesson}[-_ .]+(?P<s>.+)$"):
            m = re.match(pattern, _norm(stem))
            if m and names_someone(m.group("s")):
                return m.group("s"), lesson
    return None


def _neutral(stem: str, lesson_ids: list[str]) -> bool:
    """A folder name that names no student: a lesson's, an attempt's or a time, 'submissions', 'Copy of'."""
    return bool(
        ATTEMPT_WORD.fullmatch(stem)
        or ISO_TIME.search(stem)
        or _lesson_in(stem, lesson_ids)
        or stem.lower() in ("submitted", "submissions", "export", "files")
        or not names_someone(stem)
    )


def _read_folder(stem: str, ident: Identity, trusted: bool) -> None:
    """An attempt or time folder: its number orders a student's attempts; its time counts if ``trusted``."""
    if ATTEMPT_WORD.fullmatch(stem) or ISO_TIME.search(stem):
        if n := ATTEMPT_WORD.search(stem):
            ident.attempt_number = max(ident.attempt_number, int(n.group(1)))
        if trusted and (t := ISO_TIME.search(stem)) and (when := parse_time(t.group(0))):
            ident.attempt_time, ident.time_from = when, "a folder name"


def identify(entry: Entry, lesson_ids: list[str], wrappers: int = 0) -> Identity:
    """Who uploaded an entry, as the LMS says, and what of its names are the student's own.

    The outermost name that identifies a student wins (past the export's first ``wrappers``
    folders, see ``export_wrappers``): an LMS's prefix, a per-student folder or zip, or the file's
    own name ``<student>_<lesson>.ipynb``. The names below it are the student's upload
    (``inside``): they never say who nor when, and are checked for naming another student.
    """
    ident = Identity(filename=entry.path.name)
    chain = entry.chain
    own_file = ""  # what the LMS's prefix leaves of the uploader's name: the student's own
    for i, part in enumerate(chain):
        if i < wrappers:
            continue
        is_file = entry.names_a_file(i)
        stem = _stem(part, is_file)
        final = i == len(chain) - 1
        if lms := lms_name(stem, is_file):
            ident.student, ident.keys, ident.late, ident.layout = lms.student, lms.keys, lms.late, "lms"
            if lms.time:
                ident.attempt_time, ident.time_from = lms.time, "the file name"
            own_file = lms.file
            if final:
                ident.filename = lms.file + entry.path.suffix
        elif final:
            if found := _student_and_lesson(stem, lesson_ids):
                ident.student, lesson = found
                ident.keys = name_keys(ident.student.replace("_", " "))
                ident.filename, ident.layout = f"{lesson}{entry.path.suffix}", "file"
        elif _neutral(stem, lesson_ids):
            _read_folder(stem, ident, trusted=True)  # above the uploader: the export's own folders
            continue
        else:
            ident.student, ident.keys = stem, name_keys(stem)
            ident.layout = "zip" if is_file else "folder"
        if ident.student is not None:
            ident.at = i
        break
    if ident.at < 0:
        return ident
    ident.level = entry.level_of(ident.at)
    ident.lms_time = entry.levels[ident.level].time if entry.levels[ident.level].in_zip else None
    if own_file:
        ident.inside.append((own_file, entry.names_a_file(ident.at)))
    for j in range(ident.at + 1, len(chain)):
        is_file = entry.names_a_file(j)
        stem = _stem(chain[j], is_file)
        if not is_file:
            # below a per-student folder, the export's own folders (in the same archive) may give a time
            structure = ident.layout == "folder" and entry.level_of(j) == ident.level
            _read_folder(stem, ident, trusted=structure)
        ident.inside.append((stem, is_file) if j < len(chain) - 1 else (_stem(ident.filename, True), True))
    # "-1", "(2)" after the lesson's name: a later attempt of the same file
    fstem = ident.filename.rsplit(".", 1)[0]
    if (m := ATTEMPT_SUFFIX.match(fstem)) and _lesson_in(m.group("stem"), lesson_ids):
        ident.attempt_number = max(ident.attempt_number, int(m.group("n")))
    return ident


def in_export_structure(entry: Entry, ident: Identity) -> bool:
    """Whether a file lies in the export's own folders rather than in what a student handed in.

    True above every student's name, and inside a per-student folder in the same archive
    (nbgrader's ``<student>/<lesson>/timestamp.txt``); never inside a student's zip, nor among the
    files an LMS (Canvas, Moodle, Blackboard) says a student uploaded.
    """
    if ident.at < 0:
        return True
    return ident.layout == "folder" and ident.level == len(entry.levels) - 1


def export_wrappers(entries: list[Entry], lesson_ids: list[str]) -> int:
    """How many folders at the top wrap the whole export (a downloaded or re-zipped export).

    They are the folders that every file lies in and directly in which two or more students'
    names are (LMS prefixes, per-student folders or ``<student>_<lesson>`` files):
    ``Assignment 1 Download/Jane Smith_1_assignsubmission_file_/...``. Only the export's own
    folders can wrap it (and, when the export is a folder, a zip lying in it); a name with an
    LMS's prefix never does: what one student uploaded cannot wrap other students' files.
    """
    files = [e for e in entries if wanted(e.path) and not system_file(e.path)]  # what is collected
    if not files:
        return 0

    def own_folders(e: Entry) -> tuple[str, ...]:
        first = e.levels[0]
        return first.parts if not first.in_zip and len(e.levels) > 1 else first.parts[:-1]

    common = list(own_folders(files[0]))
    for e in files[1:]:
        folders = own_folders(e)
        n = 0
        while n < min(len(common), len(folders)) and common[n] == folders[n]:
            n += 1
        del common[n:]
    for n, part in enumerate(common):
        if lms_name(_stem(part, files[0].names_a_file(n)), files[0].names_a_file(n)):
            del common[n:]
            break
    for n in range(len(common), 0, -1):
        students = set()
        for e in files:
            chain = e.chain
            if len(chain) <= n:
                continue
            is_file = e.names_a_file(n)
            stem = _stem(chain[n], is_file)
            if lms := lms_name(stem, is_file):
                students.add(key(lms.student))
            elif n == len(chain) - 1:
                if found := _student_and_lesson(stem, lesson_ids):
                    students.add(key(found[0]))
            elif not _neutral(stem, lesson_ids):
                students.add(key(stem))
        if len(students) >= 2:
            return n
    return 0


def _spans(text: str, lesson_ids: list[str]) -> list[str]:
    """The runs of up to three words of a name that may be a person's ('Jane_Smith_hw5' -> 'jane smith' ...)."""
    words = [w for w in re.split(r"[\W_]+", text.casefold()) if w]
    plain = NOT_A_NAME | {w for lesson in lesson_ids for w in lesson.split("_")}
    spans = []
    for i in range(len(words)):
        for j in range(i + 1, min(i + 3, len(words)) + 1):
            run = words[i:j]
            if any(
                any(c.isalpha() for c in w) and w not in plain and not ATTEMPT_WORD.fullmatch(w) for w in run
            ):
                spans.append(" ".join(run))
    return spans


def names_another(
    ident: Identity, uploader: str, students: dict[str, set[str]], lesson_ids: list[str]
) -> str | None:
    """The first name inside an upload that identifies a student of the class other than its uploader.

    ``students`` holds every key a student goes by -> their ids (the roster's, or the uploaders' of
    this export). A name inside counts when the LMS prefix it carries, or a run of its words, is
    another student's name, login or id; a name that also names the uploader is theirs.
    """
    mine = set(ident.keys)
    for name, is_file in ident.inside:
        readings = []  # (what the name says, the keys it says it with)
        if lms := lms_name(name, is_file):
            readings.append((lms.student, lms.keys))
        readings += [(span, [k for k in name_keys(span) if len(k) >= 3]) for span in _spans(name, lesson_ids)]
        others = []
        for said, keys in readings:
            found = {s for k in keys for s in students.get(k, ())}
            if uploader in found or mine & set(keys):
                break  # the name is the uploader's own
            if found:
                others.append(said)
        else:
            if others:
                return others[0]
    return None


def parse_time(text: str) -> datetime.datetime | None:
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


def roster_rows(path: Path) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """Each student row of a roster CSV: (student id, its cells by normalised header, its cells as
    written). The student id is the first id column the row fills (an email: its part before the
    @), else its name made a folder name. Canvas's "Points Possible" row is no student."""
    rows = []
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
            if sid:
                rows.append((sid, row, {k: (v or "").strip() for k, v in raw.items() if k}))
    return rows


def read_roster(path: Path) -> Roster:
    """Every student of a roster CSV and the keys they go by.

    Recognised columns (any case; spaces or underscores): a student id (``student id``, ``id``,
    ``login``, ``username``, ``sis login id`` ...: the first present names the folder), names
    (``name``, ``sortable name`` such as "Smith, Jane", ``first name`` + ``last name``), ``email``,
    and LMS ids (``user id``, ``canvas user id``, ``sis user id``, ``lms id`` ...). Canvas's own
    gradebook export (Student, ID, SIS User ID, SIS Login ID) works as it is.
    """
    roster = Roster()
    for sid, row, _ in roster_rows(path):
        keys, derived = [key(sid)], []
        for column, value in row.items():
            if not value or column not in KEY_COLUMNS | {"full name"}:
                continue
            if column in NAME_COLUMNS | {"full name"}:
                keys.append(key(value))
                derived += name_keys(value)[1:]
            elif column in EMAIL_COLUMNS:
                keys += [key(value), key(value.split("@")[0])]
            else:
                keys.append(key(value))
        roster.add(list(dict.fromkeys(keys)), sid)
        roster.add(derived, sid, derived=True)
    return roster
