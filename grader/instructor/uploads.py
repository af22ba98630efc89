"""Reading an LMS's export: every file of a zip or a folder, zips inside zips opened, within caps.

Only notebooks and ``timestamp.txt`` files are read; every other file is listed by its name. Sizes
are capped on what is actually decompressed, whatever a zip's headers claim (``MAX_MEMBER_BYTES``,
``MAX_ARCHIVE_BYTES``, ``MAX_TOTAL_BYTES``, ``MAX_DEPTH``): what passes a cap is reported, never
read to its end. Whose each file is and for which lesson is ``students``'s; placing them is
``collect``'s (whose docstring tells the whole of collecting).
"""

from __future__ import annotations

import datetime
import io
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

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
class Outcome:
    source: str
    action: str  # "placed", "superseded", "ignored", "unmatched"
    reason: str = ""
    student: str = ""
    lesson: str = ""
    dest: str = ""


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


def wanted(path: PurePosixPath) -> bool:
    """Whether collect reads a file's content: notebooks and timestamp files only."""
    return path.suffix.lower() == ".ipynb" or path.name == TIMESTAMP


def system_file(path: PurePosixPath) -> bool:
    """Whether a file is the operating system's, not a student's (.DS_Store, __MACOSX/, ._ copies)."""
    return path.name.lower() in SYSTEM_FILES or "__MACOSX" in path.parts or path.name.startswith("._")


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
            if system_file(path) or not (_is_zip(path) or wanted(path)):
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
        if _is_zip(rel) and not system_file(rel):
            _open_zip(p, str(rel), levels, 1, budget, entries, bad)
        elif system_file(rel) or not wanted(rel):
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
