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

Everything below that name is the student's upload. A notebook whose upload
names another student of the class (a folder ``doejohn/`` in Jane's zip, a
file ``doejohn_05_softmax.ipynb`` or another LMS prefix) is not matched,
never placed for either of them.

With a roster (a CSV with any of name, sortable name, first/last name, email,
login/username, SIS ids, the LMS user id and a student id column), each file
is matched by the LMS user id, login or name it carries, and must match
exactly one student; the student id column names the submission folder.
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

import csv
import datetime
import io
import json
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader import course
from grader.classroom import escape

SYSTEM_FILES = {".ds_store", "thumbs.db", "desktop.ini", "icon\r"}
MB = 2**20
MAX_DEPTH = 4  # zips inside zips: the export's own zip (or a zip in an exported folder) is the first
MAX_MEMBER_BYTES = 50 * MB  # a notebook (or timestamp.txt) larger than this uncompressed is not read
MAX_ARCHIVE_BYTES = 512 * MB  # a zip inside the export, and all it holds, uncompressed
MAX_TOTAL_BYTES = 2 * 2**30  # all that is read out of one export, uncompressed
CHUNK = MB  # members are read this much at a time, the caps checked as they are read
SPOOL_BYTES = 16 * MB  # a zip inside the export larger than this is opened from a temporary file
TIMESTAMP = "timestamp.txt"


@dataclass
class Level:
    """One archive an entry lies in: the export itself (a zip or a folder), then each zip inside."""

    parts: tuple[str, ...]  # the member's path in this archive (a nested zip's or the file's)
    time: datetime.datetime | None  # the time this archive records for the member (None: a file on disk)
    in_zip: bool  # False for the files of an exported folder


@dataclass
class Entry:
    """One file of the export: where it lies, and its content when collect needs it."""

    source: str  # where it was, e.g. "export.zip!Jane Smith_123_assignsubmission_file_/hw.ipynb"
    levels: list[Level]  # the archives it lies in, outermost first
    data: bytes = b""  # read only for notebooks and timestamp.txt, within the caps
    mtime: datetime.datetime | None = None  # its own time (zip or disk): orders equal attempts only

    @property
    def path(self) -> PurePosixPath:
        """Its path inside its own archive (folders included)."""
        return PurePosixPath(*self.levels[-1].parts)

    @property
    def outer(self) -> list[str]:
        """The path parts of the zips it was found in (innermost last)."""
        return [p for level in self.levels[:-1] for p in level.parts]

    @property
    def chain(self) -> list[str]:
        """Every name on its way from the export's top to the file itself."""
        return [p for level in self.levels for p in level.parts]

    def level_of(self, index: int) -> int:
        """Which of its levels holds the name at ``index`` of ``chain``."""
        end = 0
        for n, level in enumerate(self.levels):
            end += len(level.parts)
            if index < end:
                return n
        return len(self.levels) - 1

    def names_a_file(self, index: int) -> bool:
        """Whether the name at ``index`` of ``chain`` is a file's (a nested zip's or its own), not a folder's."""
        end = 0
        for level in self.levels:
            end += len(level.parts)
            if index == end - 1:
                return True
        return False


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
                lines += [f"  {o.source}: {o.reason}" for o in rows]
        return "\n".join(lines)


# ------------------------------------------------------------------ reading the export


class TooLarge(Exception):
    """A member, a zip inside the export or the whole export passed its cap while being read."""


class Budget:
    """Bytes that may still be read out of an archive; a nested zip's budget also draws on its parents'."""

    def __init__(self, limit: int, why: str, parent: Budget | None = None) -> None:
        self.left, self.why, self.parent = limit, why, parent

    def take(self, n: int) -> None:
        budget: Budget | None = self
        while budget is not None:
            budget.left -= n
            if budget.left < 0:
                raise TooLarge(budget.why)
            budget = budget.parent


def size_text(n: int) -> str:
    """50 * 2**20 -> '50 MB', 2 * 2**30 -> '2 GiB'."""
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / MB:g} MB"


def copy_capped(src, dst, limit: int, budget: Budget) -> None:
    """Copy a stream CHUNK by CHUNK, stopping as soon as more than ``limit`` bytes or the budget come out.

    The cap is counted on what is actually decompressed, not on the size a zip's header declares.
    """
    total = 0
    while chunk := src.read(CHUNK):
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"larger than {size_text(limit)} uncompressed")
        budget.take(len(chunk))
        dst.write(chunk)


def _wanted(path: PurePosixPath) -> bool:
    """Whether collect reads a file's content: notebooks and timestamp files only."""
    return path.suffix.lower() == ".ipynb" or path.name == TIMESTAMP


def _is_zip(path: PurePosixPath) -> bool:
    return path.suffix.lower() == ".zip"


def _zip_time(info: zipfile.ZipInfo) -> datetime.datetime | None:
    try:
        return datetime.datetime(*info.date_time) if info.date_time > (1980, 1, 1, 0, 0, 0) else None
    except ValueError:
        return None


def _extract(zf: zipfile.ZipFile, info: zipfile.ZipInfo, dst, limit: int, budget: Budget) -> None:
    """One member of a zip into ``dst``, within ``limit`` and the budget, never trusting its header."""
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        # bzip2 and lzma members are decompressed by zipfile without a bound on each step's output
        method = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "lzma"}.get(
            info.compress_type, "an unusual method"
        )
        raise ValueError(f"compressed with {method}, which collect does not open; zip it again as usual")
    if info.file_size > limit:  # the header already says so: nothing is decompressed
        raise TooLarge(f"larger than {size_text(limit)} uncompressed")
    with zf.open(info) as src:
        copy_capped(src, dst, limit, budget)


def _walk_zip(
    zf: zipfile.ZipFile,
    source: str,
    above: list[Level],
    depth: int,
    budget: Budget,
    out: list[Entry],
    bad: list[Outcome],
) -> None:
    """Every member of an open zip (the ``depth``-th zip inside the export), nested zips opened."""
    infos = [info for info in zf.infolist() if not info.is_dir()]
    # plain files first: a bomb in one student's zip cannot use up the export's budget before them
    infos.sort(key=lambda info: _is_zip(PurePosixPath(info.filename)))
    for info in infos:
        where = f"{source}!{info.filename}"
        path = PurePosixPath(info.filename)
        level = Level(path.parts, _zip_time(info), in_zip=True)
        levels = [*above, level]
        try:
            if _system_file(path) or not (_is_zip(path) or _wanted(path)):
                out.append(Entry(where, levels, mtime=level.time))  # reported by name, not read
            elif _is_zip(path):
                if depth >= MAX_DEPTH:
                    bad.append(
                        Outcome(
                            where,
                            "unmatched",
                            f"zip nested too deeply (more than {MAX_DEPTH} zips inside each other): not opened",
                        )
                    )
                    continue
                inner = Budget(
                    MAX_ARCHIVE_BYTES,
                    f"its zip holds more than {size_text(MAX_ARCHIVE_BYTES)} uncompressed",
                    budget,
                )
                with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as tmp:
                    _extract(zf, info, tmp, MAX_ARCHIVE_BYTES, budget)
                    tmp.seek(0)
                    _open_zip(tmp, where, levels, depth + 1, inner, out, bad)
            else:
                buf = io.BytesIO()
                _extract(zf, info, buf, MAX_MEMBER_BYTES, budget)
                out.append(Entry(where, levels, buf.getvalue(), level.time))
        except TooLarge as e:
            what = "not opened" if _is_zip(path) else "not placed"
            bad.append(Outcome(where, "ignored", f"{e}: {what}"))
        except Exception as e:  # noqa: BLE001 - a damaged or forged member: reported, the rest still read
            bad.append(Outcome(where, "unmatched", f"could not be extracted ({e}): not placed"))


def _open_zip(
    file, source: str, above: list[Level], depth: int, budget: Budget, out: list[Entry], bad: list[Outcome]
) -> None:
    """Open a zip (a path, or a nested zip's temporary copy) and walk it; a damaged one is reported."""
    try:
        zf = zipfile.ZipFile(file)
    except Exception as e:  # noqa: BLE001 - not a zip, or a damaged one
        bad.append(Outcome(source, "unmatched", f"not a readable zip file ({e})"))
        return
    with zf:
        _walk_zip(zf, source, above, depth, budget, out, bad)


def read_export(export: Path) -> tuple[list[Entry], list[Outcome]]:
    """Every file of a zip export or folder (nested zips opened), and the ones that could not be read.

    Only notebooks and timestamp files are read, each within MAX_MEMBER_BYTES; the export within
    MAX_TOTAL_BYTES in all. What is over a cap is reported ("ignored"), never read to its end.
    """
    entries: list[Entry] = []
    bad: list[Outcome] = []
    budget = Budget(MAX_TOTAL_BYTES, f"the export holds more than {size_text(MAX_TOTAL_BYTES)} uncompressed")
    if not export.is_dir():
        _open_zip(export, export.name, [], 1, budget, entries, bad)
        return entries, bad
    files = sorted(p for p in export.rglob("*") if p.is_file())
    for p in sorted(files, key=lambda p: _is_zip(p)):  # plain files first, as in a zip
        rel = PurePosixPath(p.relative_to(export).as_posix())
        levels = [Level(rel.parts, None, in_zip=False)]
        mtime = datetime.datetime.fromtimestamp(p.stat().st_mtime)
        if _is_zip(rel) and not _system_file(rel):
            _open_zip(p, str(rel), levels, 1, budget, entries, bad)
        elif _system_file(rel) or not _wanted(rel):
            entries.append(Entry(str(rel), levels, mtime=mtime))
        else:
            try:
                if p.stat().st_size > MAX_MEMBER_BYTES:
                    raise TooLarge(f"larger than {size_text(MAX_MEMBER_BYTES)}")
                buf = io.BytesIO()
                with p.open("rb") as src:
                    copy_capped(src, buf, MAX_MEMBER_BYTES, budget)
                entries.append(Entry(str(rel), levels, buf.getvalue(), mtime))
            except TooLarge as e:
                bad.append(Outcome(str(rel), "ignored", f"{e}: not placed"))
            except OSError as e:
                bad.append(Outcome(str(rel), "unmatched", f"could not be read ({e})"))
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


@dataclass
class LmsName:
    """What an LMS's prefix on a file or folder name says."""

    student: str
    keys: list[str]
    late: bool = False
    time: datetime.datetime | None = None  # Blackboard's attempt time
    file: str = ""  # what follows the prefix: the student's own name for the file


def lms_name(stem: str, is_file: bool) -> LmsName | None:
    """The student an LMS's prefix names (Moodle folders, Blackboard, Moodle files, Canvas), if any."""
    if not is_file and (m := MOODLE.match(stem)):
        return LmsName(m["name"], [*_name_keys(m["name"]), key(m["uid"])])
    if m := BLACKBOARD.match(stem):
        return LmsName(m["user"], [key(m["user"])], time=_parse_time(m["ts"]), file=m["file"] or "")
    if is_file and (m := MOODLE_FILE.match(stem)):
        return LmsName(m["name"], [*_name_keys(m["name"]), key(m["uid"])], file=m["file"])
    if m := CANVAS.match(stem):
        return LmsName(m["name"], [key(m["uid"]), key(m["name"])], late=bool(m["late"]), file=m["file"])
    return None


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
        if trusted and (t := ISO_TIME.search(stem)) and (when := _parse_time(t.group(0))):
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
                ident.keys = _name_keys(ident.student.replace("_", " "))
                ident.filename, ident.layout = f"{lesson}{entry.path.suffix}", "file"
        elif _neutral(stem, lesson_ids):
            _read_folder(stem, ident, trusted=True)  # above the uploader: the export's own folders
            continue
        else:
            ident.student, ident.keys = stem, _name_keys(stem)
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
    files = [e for e in entries if _wanted(e.path) and not _system_file(e.path)]  # what is collected
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
        readings += [
            (span, [k for k in _name_keys(span) if len(k) >= 3]) for span in _spans(name, lesson_ids)
        ]
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
            for k in ident.keys or _name_keys(ident.student):
                found.setdefault(k, set()).add(slug(ident.student))
    return found


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
    # timestamp.txt files by the folder they lie in, and whether the export's own folders hold them
    stamps: dict[tuple, tuple[Entry, bool]] = {}
    for e, ident in zip(entries, idents):
        if e.path.name == TIMESTAMP and ident is not None:
            stamps[(tuple(e.outer), e.path.parent)] = (e, in_export_structure(e, ident))
    candidates: dict[tuple[str, str], list[tuple[tuple, Entry, Identity]]] = {}
    for entry, ident in zip(entries, idents):
        path = entry.path
        if _system_file(path):
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
        if names is not None:
            sid, why = names.find(ident.keys or _name_keys(ident.student))
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
            ident.attempt_time = _parse_time(stamp.data.decode(errors="replace"))
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
