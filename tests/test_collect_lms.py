"""`grader collect` trusts only the LMS: who uploaded a file, when, and how much there is to read.

Each test builds a real export in tmp_path the way an LMS (or an attacker's upload inside it) would,
runs collect on it, and checks what an instructor would see: where notebooks were placed, the
timestamp.txt nbgrader reads, and the report line of every file.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grader.instructor import collect, uploads

LESSON = "05_softmax"
MB = 2**20
ROSTER = (
    "name,sortable name,email,user id\n"
    'Jane Smith,"Smith, Jane",jsmith@uni.edu,12345\n'
    'John Doe,"Doe, John",jdoe@uni.edu,22345\n'
    'Ada Lovelace,"Lovelace, Ada",alovelace@uni.edu,31337\n'
    'Grace Hopper,"Hopper, Grace",ghopper@uni.edu,41000\n'
)
NOV, DEC = (2026, 11, 1, 0, 0, 0), (2026, 12, 3, 10, 0, 0)  # zip times: even seconds


def nb(who: str) -> bytes:
    """A notebook that says whose work it is."""
    return json.dumps({"cells": [], "metadata": {"author": who}, "nbformat": 4, "nbformat_minor": 5}).encode()


def zip_of(files: dict[str, bytes | tuple[bytes, tuple]]) -> bytes:
    """A zip of name -> content, or name -> (content, the time the zip records for it)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, value in files.items():
            data, when = value if isinstance(value, tuple) else (value, NOV)
            zf.writestr(zipfile.ZipInfo(name, date_time=when), data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def zeros_zip(name: str, size: int) -> bytes:
    """A zip holding ``size`` zero bytes as ``name``, written in pieces (300 MB come to ~300 KB)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open(name, "w") as f:
            piece = bytes(MB)
            for _ in range(size // MB):
                f.write(piece)
    return buf.getvalue()


def lie_about_size(data: bytes, claimed: int) -> bytes:
    """A one-member zip whose headers (local and central) claim ``claimed`` bytes uncompressed."""
    raw = bytearray(data)
    local, central = raw.index(b"PK\x03\x04"), raw.rindex(b"PK\x01\x02")
    raw[local + 22 : local + 26] = claimed.to_bytes(4, "little")
    raw[central + 24 : central + 28] = claimed.to_bytes(4, "little")
    return bytes(raw)


def run(tmp_path: Path, files: dict, roster: bool = False) -> tuple[collect.CollectReport, Path]:
    export = tmp_path / "submissions.zip"
    export.write_bytes(zip_of(files))
    if roster:
        (tmp_path / "roster.csv").write_text(ROSTER)
    dest = tmp_path / "submitted"
    rep = collect.collect(
        export, roster=tmp_path / "roster.csv" if roster else None, lesson_ids=[LESSON], dest_root=dest
    )
    return rep, dest


def outcome(rep: collect.CollectReport, tail: str) -> collect.Outcome:
    """The one report line of the file whose source ends with ``tail`` (it must be exactly one)."""
    found = [o for o in rep.outcomes if o.source.endswith(tail)]
    assert len(found) == 1, found
    return found[0]


def placed(dest: Path, student: str) -> str:
    return json.loads((dest / student / LESSON / f"{LESSON}.ipynb").read_text())["metadata"]["author"]


def every_file_once(rep: collect.CollectReport, count: int) -> None:
    sources = [o.source for o in rep.outcomes]
    assert len(sources) == len(set(sources)) == count, sources


@pytest.fixture(autouse=True)
def _work(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_WORK", str(tmp_path / "work"))  # no gradebook: no due dates


# ------------------------------------------------------------------ who uploaded it


@pytest.mark.parametrize("with_roster", [False, True], ids=["no roster", "roster"])
def test_a_zip_in_janes_upload_naming_john_is_placed_for_nobody(tmp_path, with_roster):
    rep, dest = run(
        tmp_path,
        {
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane"), NOV),
            "doejohn_22345_902_05_softmax.ipynb": (nb("john"), NOV),
            # uploaded by Jane (the LMS says so), later than John's, naming John inside
            "smithjane_12345_903_softmax_final.zip": (
                zip_of({"doejohn/05_softmax.ipynb": nb("forged")}),
                DEC,
            ),
        },
        roster=with_roster,
    )
    jane, john = ("jsmith", "jdoe") if with_roster else ("smithjane", "doejohn")
    assert placed(dest, john) == "john" and placed(dest, jane) == "jane"
    forged = outcome(rep, "doejohn/05_softmax.ipynb")
    assert forged.action == "unmatched"
    assert "uploaded by smithjane but names doejohn" in forged.reason and "not placed" in forged.reason
    assert "uploaded by smithjane but names doejohn" in rep.format()
    assert sorted(p.name for p in dest.iterdir()) == sorted([jane, john])
    every_file_once(rep, 3)


def test_a_file_name_an_upload_holds_is_reported_on_its_own_line(tmp_path):
    """A name inside a student's zip is the student's to choose: with a carriage return and a terminal's
    erase-line sequence it wiped its own report line from the instructor's console, and with a line break
    it made up a line of its own. The report shows such a name escaped, on the line of that file."""
    rep, dest = run(
        tmp_path,
        {
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane"), NOV),
            "doejohn_22345_902_all.zip": (
                zip_of({"cover\r\x1b[2K.txt": b"x", "notes\nPlaced 9 submissions.txt": b"y"}),
                DEC,
            ),
        },
    )
    shown = rep.format()
    assert "\r" not in shown and "\x1b" not in shown, shown
    lines = shown.splitlines()
    assert lines[0].startswith("Placed 1 submissions;") and not any(
        ln.startswith("Placed 9") for ln in lines[1:]
    )
    assert any("cover\\r\\x1b[2K.txt: " in ln for ln in lines), lines
    assert any("notes\\nPlaced 9 submissions.txt: " in ln for ln in lines), lines
    assert placed(dest, "smithjane") == "jane"


def test_a_name_inside_an_upload_naming_another_student_in_any_form_is_not_placed(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane"), NOV),
            "doejohn_22345_902_05_softmax.ipynb": (nb("john"), NOV),
            # Jane's own file name (after Canvas's prefix) names John
            "smithjane_12345_903_doejohn_05_softmax.ipynb": (nb("forged 1"), DEC),
            # a file with John's Canvas prefix inside Jane's zip, and his name in a folder
            "smithjane_12345_904_all.zip": (
                zip_of(
                    {
                        "doejohn_22345_999_05_softmax.ipynb": nb("forged 2"),
                        "John Doe/05_softmax.ipynb": nb("forged 3"),
                    }
                ),
                DEC,
            ),
        },
    )
    assert placed(dest, "doejohn") == "john" and placed(dest, "smithjane") == "jane"
    for tail in (
        "903_doejohn_05_softmax.ipynb",
        "doejohn_22345_999_05_softmax.ipynb",
        "John Doe/05_softmax.ipynb",
    ):
        o = outcome(rep, tail)
        assert o.action == "unmatched" and o.reason.startswith("uploaded by smithjane but names ")
    every_file_once(rep, 5)


@pytest.mark.parametrize("with_roster", [False, True], ids=["no roster", "roster"])
def test_a_canvas_file_name_shaped_like_another_lms_prefix_is_still_the_uploaders(tmp_path, with_roster):
    """After Canvas's prefix the name is the student's own: a Blackboard or Moodle prefix written there
    names nobody, gives no time and does not take the LMS's late mark away."""
    late_stamp = "2026-10-01-00-00-00"
    rep, dest = run(
        tmp_path,
        {
            "doejohn_22345_902_05_softmax.ipynb": (nb("john"), NOV),
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane"), NOV),
            # Jane's, written to read as John's Blackboard attempt of December 30
            "smithjane_12345_903_x_doejohn_attempt_2026-12-30-23-59-59_05_softmax.ipynb": (
                nb("forged 1"),
                DEC,
            ),
            # Jane's, written to read as a Moodle file of John's user id
            "smithjane_12345_904_x_22345_assignsubmission_file_05_softmax.ipynb": (nb("forged 2"), DEC),
            # Ada's late upload, written to read as a Blackboard attempt of October 1
            f"lovelaceada_LATE_31337_905_x_lovelaceada_attempt_{late_stamp}_05_softmax.ipynb": (
                nb("ada"),
                DEC,
            ),
        },
        roster=with_roster,
    )
    john, ada = ("jdoe", "alovelace") if with_roster else ("doejohn", "lovelaceada")
    assert placed(dest, john) == "john"
    assert not (dest / john / LESSON / "timestamp.txt").read_text().startswith("2026-12-30")
    forged = outcome(rep, "903_x_doejohn_attempt_2026-12-30-23-59-59_05_softmax.ipynb")
    assert forged.action == "unmatched" and forged.reason.startswith("uploaded by smithjane but names ")
    assert outcome(rep, "904_x_22345_assignsubmission_file_05_softmax.ipynb").student != john
    assert placed(dest, ada) == "ada"
    assert (dest / ada / LESSON / "timestamp.txt").read_text().startswith("2026-12-03 10:00:00")
    assert "marked late by the LMS" in outcome(rep, f"{late_stamp}_05_softmax.ipynb").reason
    every_file_once(rep, 5)


def test_a_moodle_name_never_outweighs_the_user_id_the_lms_gives(tmp_path):
    """Moodle shows the name its user chose: with a roster, the user id decides, also where the name holds
    another student's id shaped like Moodle's own suffix."""
    rep, dest = run(
        tmp_path,
        {
            "John Doe_22345_assignsubmission_file_/05_softmax.ipynb": (nb("john"), NOV),
            # Jane (user id 12345) renamed herself John Doe, and then John Doe_22345_assignsubmission_file_x
            "John Doe_12345_assignsubmission_file_/05_softmax.ipynb": (nb("jane renamed"), DEC),
            "John Doe_22345_assignsubmission_file_x_12345_assignsubmission_file_/05_softmax.ipynb": (
                nb("jane"),
                DEC,
            ),
        },
        roster=True,
    )
    assert placed(dest, "jdoe") == "john"
    assert outcome(rep, "John Doe_22345_assignsubmission_file_/05_softmax.ipynb").action == "placed"
    assert outcome(rep, f"x_12345_assignsubmission_file_/{LESSON}.ipynb").student == "jsmith"
    assert outcome(rep, f"John Doe_12345_assignsubmission_file_/{LESSON}.ipynb").student == "jsmith"
    every_file_once(rep, 3)


def test_without_a_roster_two_students_of_one_name_share_no_folder(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            # two students called Jane Smith (Canvas user ids 12345 and 99999)
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane 1"), NOV),
            "smithjane_99999_902_05_softmax.ipynb": (nb("jane 2"), DEC),
            # names without a Latin letter, and one whose accented letters are dropped
            "王伟_55_assignsubmission_file_/05_softmax.ipynb": (nb("wang wei"), NOV),
            "李娜_56_assignsubmission_file_/05_softmax.ipynb": (nb("li na"), DEC),
            "José Núñez_57_assignsubmission_file_/05_softmax.ipynb": (nb("jose"), NOV),
        },
    )
    for tail in ("12345_901_05_softmax.ipynb", "99999_902_05_softmax.ipynb"):
        o = outcome(rep, tail)
        assert o.action == "unmatched" and "--roster" in o.reason, o
    assert not (dest / "smithjane").exists()
    folders = {o.student for o in rep.by("placed")}
    assert len(folders) == 3 and "jos_n_ez" in folders, folders
    assert sorted(placed(dest, f) for f in folders) == ["jose", "li na", "wang wei"]
    every_file_once(rep, 5)


def test_an_upload_whose_folders_name_no_one_else_is_the_uploaders(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            "smithjane_12345_901_05_softmax.ipynb": (nb("jane, first try"), NOV),
            "doejohn_22345_902_05_softmax.ipynb": (nb("john"), NOV),
            "smithjane_12345_905_work.zip": (
                zip_of({"Jane Smith/attention-course/05_softmax/05_softmax.ipynb": nb("jane, later")}),
                DEC,
            ),
        },
    )
    assert placed(dest, "smithjane") == "jane, later" and placed(dest, "doejohn") == "john"
    assert outcome(rep, "smithjane_12345_901_05_softmax.ipynb").action == "superseded"
    every_file_once(rep, 3)


def test_per_student_folders_name_the_student_at_the_top(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            "jane/05_softmax.ipynb": nb("jane"),
            "john/05_softmax.ipynb": nb("john"),
            "jane/john/05_softmax.ipynb": (nb("forged"), DEC),  # once read as John's (innermost folder)
        },
    )
    assert placed(dest, "jane") == "jane" and placed(dest, "john") == "john"
    forged = outcome(rep, "jane/john/05_softmax.ipynb")
    assert forged.action == "unmatched" and "uploaded by jane but names john" in forged.reason
    every_file_once(rep, 3)


def test_a_re_zipped_export_in_one_folder_still_names_each_student(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            "CS101 hw5/smithjane_12345_901_05_softmax.ipynb": nb("jane"),
            "CS101 hw5/doejohn_22345_902_05_softmax.ipynb": nb("john"),
            "notes.txt": b"downloaded on Monday",
        },
    )
    assert placed(dest, "smithjane") == "jane" and placed(dest, "doejohn") == "john"
    every_file_once(rep, 3)


# ------------------------------------------------------------------ when


def test_a_timestamp_txt_in_a_students_zip_does_not_backdate_the_upload(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            # Canvas recorded the upload on December 3; inside, everything claims November 1
            "smithjane_12345_901_hw.zip": (
                zip_of(
                    {"05_softmax.ipynb": (nb("jane"), NOV), "timestamp.txt": ("2026-11-01 00:00:00", NOV)}
                ),
                DEC,
            ),
            "Ada Lovelace_31337_assignsubmission_file_/05_softmax.ipynb": (nb("ada"), DEC),
            "Ada Lovelace_31337_assignsubmission_file_/timestamp.txt": ("2026-11-01 00:00:00", DEC),
        },
    )
    for student in ("smithjane", "ada_lovelace"):
        stamp = (dest / student / LESSON / "timestamp.txt").read_text()
        assert stamp.startswith("2026-12-03 10:00:00"), (student, stamp)
        reason = next(o.reason for o in rep.by("placed") if o.student == student)
        assert "(from the zip)" in reason and "timestamp.txt beside it is the student's own" in reason
    for tail in ("hw.zip!timestamp.txt", "_assignsubmission_file_/timestamp.txt"):
        o = outcome(rep, tail)
        assert o.action == "ignored" and "inside a student's upload" in o.reason
    every_file_once(rep, 4)


def test_the_student_cannot_backdate_with_a_file_name_either(tmp_path):
    rep, dest = run(tmp_path, {"smithjane_12345_901_05_softmax_2026-11-01-00-00-00.ipynb": (nb("jane"), DEC)})
    assert (dest / "smithjane" / LESSON / "timestamp.txt").read_text().startswith("2026-12-03 10:00:00")


def test_nbgraders_own_folders_keep_their_timestamp(tmp_path):
    rep, dest = run(
        tmp_path,
        {
            "submitted/jane/05_softmax/05_softmax.ipynb": (nb("jane"), DEC),
            "submitted/jane/05_softmax/timestamp.txt": ("2026-11-15 08:30:00", DEC),
        },
    )
    assert (dest / "jane" / LESSON / "timestamp.txt").read_text().startswith("2026-11-15 08:30:00")
    assert "read with its notebook" in outcome(rep, "timestamp.txt").reason


# ------------------------------------------------------------------ how much


def test_the_size_cap_is_counted_while_reading_not_taken_from_a_header():
    class Endless(io.RawIOBase):  # a member that never ends, whatever its header said
        read_so_far = 0

        def read(self, n=-1):
            self.read_so_far += n
            return bytes(n)

    src, sink = Endless(), io.BytesIO()
    budget = uploads.Budget(uploads.MAX_TOTAL_BYTES, "over")
    with pytest.raises(uploads.TooLarge, match="larger than 50 MB uncompressed"):
        uploads.copy_capped(src, sink, uploads.MAX_MEMBER_BYTES, budget)
    assert src.read_so_far <= uploads.MAX_MEMBER_BYTES + uploads.CHUNK


# Peak memory is measured in a fresh process: tracemalloc for what Python allocates, and the
# process's own high-water mark (VmHWM: ru_maxrss would carry over pytest's own, from the fork).
BOMB_SCRIPT = """
import json, os, sys, tracemalloc
from pathlib import Path
tracemalloc.start()
from grader.instructor import collect
rep = collect.collect(Path(sys.argv[1]), lesson_ids=["05_softmax"], dest_root=Path(sys.argv[2]))
status = Path("/proc/self/status")
hwm = [int(line.split()[1]) / 1024 for line in status.read_text().splitlines() if line.startswith("VmHWM")]
print(json.dumps({"python_peak_mb": tracemalloc.get_traced_memory()[1] / 2**20, "rss_peak_mb": hwm[0] if hwm else 0,
                  "outcomes": [[o.source, o.action, o.reason, o.student] for o in rep.outcomes]}))
"""


def test_zip_bombs_are_reported_and_the_class_still_collected_in_little_memory(tmp_path):
    bomb = zeros_zip("05_softmax.ipynb", 300 * MB)  # ~300 KB that hold 300 MB
    liar = lie_about_size(bomb, 1000)  # says 1000 bytes, holds 300 MB
    four_deep = zip_of(
        {"a.zip": zip_of({"b.zip": zip_of({"05_softmax.ipynb": nb("ada"), "bomb.zip": bomb})})}
    )
    export = tmp_path / "submissions.zip"
    export.write_bytes(
        zip_of(
            {
                "smithjane_12345_901_05_softmax.ipynb": nb("jane"),
                "doejohn_22345_902_bomb.zip": bomb,
                "lovelaceada_31337_903_nested.zip": four_deep,
                "hoppergrace_41000_904_liar.zip": liar,
                "turingalan_51000_905_05_softmax.ipynb": nb("alan"),
            }
        )
    )
    dest = tmp_path / "submitted"
    done = subprocess.run(
        [sys.executable, "-c", BOMB_SCRIPT, str(export), str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # it took 2.1 GB before the caps; now each member is refused before it is read, or read in 1 MB steps
    assert result["python_peak_mb"] < 20 and result["rss_peak_mb"] < 150, result
    outcomes = {src.split("!", 1)[1]: (action, reason) for src, action, reason, _ in result["outcomes"]}
    assert len(outcomes) == len(result["outcomes"]) == 6
    assert outcomes["doejohn_22345_902_bomb.zip!05_softmax.ipynb"] == (
        "ignored",
        "larger than 50 MB uncompressed: not placed",
    )
    action, reason = outcomes["lovelaceada_31337_903_nested.zip!a.zip!b.zip!bomb.zip"]
    assert action == "unmatched" and "nested too deeply" in reason
    action, reason = outcomes["hoppergrace_41000_904_liar.zip!05_softmax.ipynb"]
    assert action == "unmatched" and "not placed" in reason
    # the rest of the class is collected
    assert {placed(dest, s) for s in ("smithjane", "lovelaceada", "turingalan")} == {"jane", "ada", "alan"}
    assert not (dest / "doejohn").exists() and not (dest / "hoppergrace").exists()


def test_the_whole_export_is_capped_and_plain_files_are_read_first(tmp_path, monkeypatch):
    monkeypatch.setattr(uploads, "MAX_TOTAL_BYTES", 1 * MB)
    big = b" " * (600 * 1024)
    rep, dest = run(
        tmp_path,
        {
            # a student's zip of notebooks that together pass the export's cap, listed first
            "doejohn_22345_902_many.zip": zip_of({f"{LESSON}-{n}.ipynb": big for n in range(3)}),
            "smithjane_12345_901_05_softmax.ipynb": nb("jane"),
        },
    )
    assert placed(dest, "smithjane") == "jane"
    over = [o for o in rep.outcomes if "the export holds more than 1 MB uncompressed" in o.reason]
    assert over and all(o.action == "ignored" and o.reason.endswith("not placed") for o in over)
    every_file_once(rep, 4)


def test_an_oversized_notebook_in_an_exported_folder_is_not_read(tmp_path):
    export = tmp_path / "export"
    (export / "jane").mkdir(parents=True)
    (export / "john").mkdir()
    (export / "jane" / "05_softmax.ipynb").write_bytes(nb("jane"))
    with (export / "john" / "05_softmax.ipynb").open("wb") as f:
        f.truncate(300 * MB)  # sparse: takes no disk
    dest = tmp_path / "submitted"
    rep = collect.collect(export, lesson_ids=[LESSON], dest_root=dest)
    assert placed(dest, "jane") == "jane" and not (dest / "john").exists()
    o = outcome(rep, "john/05_softmax.ipynb")
    assert o.action == "ignored" and o.reason.startswith("larger than 50 MB")
