"""Instructor command line: ``python -m grader <command>``.

Commands, in the order of a term:
  check-sources  check each lesson's sources against CONTRIBUTING.md's rules, without a kernel
  build          regenerate notebooks/ (student versions) from solutions/ with nbgrader
  release        build, then pack the student bundle (zip) and prove it clean
  collect        place an LMS export's notebooks where nbgrader expects them
  grade          autograde every submission, several at a time, resumable
  feedback       one HTML page per student and lesson, hidden tests never shown
  export         nbgrader's grades CSV and a class report with a chart

Everything a run writes goes to the work folder (``_grading/``, or
``$ATTENTION_COURSE_WORK``); the gradebook there is nbgrader's, so the
formgrader and plain ``nbgrader`` commands keep working on the same course.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from grader import course


def _size(text: str) -> int:
    """'4G', '512M', '2GiB' or bytes -> bytes (0: no limit)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in scale:
        return int(float(t[:-1]) * scale[t[-1]])
    return int(float(t))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grader",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.split("\n")[2:]),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    src = sub.add_parser("check-sources", help="check solutions/ against the course's rules for lessons")
    src.add_argument(
        "--fix-ids", action="store_true", help="first give each nbgrader cell its grade id as cell id"
    )
    src.add_argument("lessons", nargs="*", help="lesson ids, e.g. 12_rotary (default: every lesson)")

    build = sub.add_parser("build", help="regenerate notebooks/ from solutions/ with nbgrader")
    build.add_argument("lessons", nargs="*", help="lesson ids (default: all)")

    rel = sub.add_parser("release", help="regenerate notebooks/, then pack and check the student bundle")
    rel.add_argument(
        "--out", type=Path, help="where to write the zip (default: <work>/release/attention-step-by-step.zip)"
    )
    rel.add_argument(
        "--no-build", action="store_true", help="pack notebooks/ as they are, without regenerating"
    )

    col = sub.add_parser("collect", help="place an LMS export's notebooks where nbgrader expects them")
    col.add_argument("export", type=Path, help="the LMS zip export (zips inside are opened too) or a folder")
    col.add_argument(
        "--roster", type=Path, help="CSV with an id column and name/email/username/lms_id columns"
    )
    col.add_argument("--lesson", action="append", dest="lessons", help="only these lessons (repeatable)")
    col.add_argument("--dry-run", action="store_true", help="report what would be placed, write nothing")

    grd = sub.add_parser("grade", help="autograde every submission of every lesson (resumable)")
    grd.add_argument("lessons", nargs="*", help="lesson ids (default: all)")
    grd.add_argument("--student", action="append", dest="students", help="only these students (repeatable)")
    grd.add_argument(
        "--workers",
        type=int,
        help="submissions graded at once (default: one per core, at most one per 8 submissions)",
    )
    grd.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds per cell (default: Execute.timeout of nbgrader_config.py)",
    )
    grd.add_argument(
        "--memory", type=_size, default=4 << 30, help="memory per notebook, e.g. 2G (default 4G; 0: no cap)"
    )
    grd.add_argument(
        "--notebook-timeout", type=int, default=600, help="seconds per submission, all in (default 600)"
    )
    grd.add_argument(
        "--executor",
        choices=("local", "dask"),
        default="local",
        help="worker processes here (default) or a Dask cluster",
    )
    grd.add_argument(
        "--scheduler",
        help="Dask scheduler address (tcp://host:8786); without it a local Dask cluster is started",
    )
    grd.add_argument(
        "--force", action="store_true", help="grade again even submissions already graded from the same file"
    )
    grd.add_argument("--quiet", action="store_true", help="no progress bar")

    fb = sub.add_parser("feedback", help="HTML feedback for every graded submission")
    fb.add_argument("lessons", nargs="*", help="lesson ids (default: all)")
    fb.add_argument("--student", action="append", dest="students", help="only these students (repeatable)")
    fb.add_argument("--workers", type=int, help="pages generated at once (default: one per core)")

    ex = sub.add_parser("export", help="grades CSV (nbgrader's) and the class report with its chart")
    ex.add_argument("--out", type=Path, help="folder to write to (default: <work>/report)")
    ex.add_argument(
        "--roster", type=Path, help="the class list (Canvas's gradebook export works as is) for the LMS files"
    )
    return parser


def _default_timeout() -> int:
    from grader.classroom.grading import course_config

    try:
        return int(course_config().Execute.timeout)
    except Exception:  # noqa: BLE001 - not set there
        return 60


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    start = time.perf_counter()

    if args.command == "check-sources":
        from grader.sources import check_sources, fix_cell_ids

        if args.fix_ids:
            for line in fix_cell_ids():
                print(line)
        unknown = sorted(set(args.lessons) - set(course.lessons()))
        if unknown:
            print(
                f"no such lesson in solutions/: {', '.join(unknown)} (lessons: {', '.join(course.lessons())})"
            )
            return 2
        problems = check_sources(only=args.lessons or None)
        for p in problems:
            print(p)
        checked = len(args.lessons or course.lessons())
        print(
            f"{len(problems)} problems in solutions/"
            if problems
            else f"solutions/: {checked} lessons follow the rules"
        )
        return 1 if problems else 0

    if args.command == "build":
        for path in course.build_notebooks(only=args.lessons or None):
            print(f"wrote {path.relative_to(course.ROOT)}")
        print(f"built in {time.perf_counter() - start:.1f} s")
        return 0

    if args.command == "release":
        from grader.instructor import release

        path, problems, written = release.release(out=args.out, build=not args.no_build)
        for p in written:
            print(f"wrote {p.relative_to(course.ROOT) if p.is_relative_to(course.ROOT) else p}")
        if problems:
            print("The student bundle is NOT clean; nothing was written:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
        print(
            f"student bundle: {path} (checked: no solutions, hidden tests, reference code or grader imports)"
        )
        return 0

    if args.command == "collect":
        from grader.instructor import collect

        report = collect.collect(
            args.export, roster=args.roster, lesson_ids=args.lessons, dry_run=args.dry_run
        )
        print(report.format())
        if not args.dry_run:
            out = course.work_dir() / "classroom" / f"collect-{time.strftime('%Y%m%d-%H%M%S')}.csv"
            report.write_csv(out)
            print(f"every file and what became of it: {out}")
        return 1 if report.by("unmatched") else 0

    if args.command == "grade":
        from grader.classroom import grading
        from grader.classroom.jobs import Options

        options = Options(
            timeout=args.timeout or _default_timeout(),
            memory=args.memory or None,
            notebook_timeout=args.notebook_timeout,
        )
        from grader.classroom import seal

        sealed, why = seal.available()
        if not sealed and seal.unsealed_refusal() is None:
            print(f"NOT SEALED ({why}): grading under the in-process guard only, as asked.", file=sys.stderr)
        try:
            summary = grading.grade(
                args.lessons or None,
                args.students,
                options=options,
                workers=args.workers,
                executor=args.executor,
                address=args.scheduler,
                force=args.force,
                progress=not args.quiet,
            )
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(grading.format_summary(summary), file=sys.stderr if summary.cannot_grade else sys.stdout)
        if summary.cannot_grade:
            return 2
        if summary.interrupted:
            return 130
        if summary.graded or summary.skipped:
            print("Next: python -m grader feedback, then python -m grader export")
        return 1 if summary.failed else 0

    if args.command == "feedback":
        from grader.instructor import feedback

        results = feedback.generate(args.lessons or None, args.students, workers=args.workers)
        bad = [r for r in results if "error" in r]
        print(
            f"{len(results) - len(bad)} feedback pages in {course.work_dir() / 'feedback'} ({time.perf_counter() - start:.0f} s)"
        )
        for r in bad:
            print(
                f"  not written: {r['student']} / {r['lesson']}: {r['error'].strip().splitlines()[-1]}",
                file=sys.stderr,
            )
        return 1 if bad else 0

    if args.command == "export":
        from grader.instructor import report

        paths = report.export(args.out, roster=args.roster)
        rep = paths.pop("report_data")
        for name, path in paths.items():
            print(f"{name:15} {path}")
        if rep.flagged:
            print(f"{len(rep.flagged)} submissions flagged for review: see the class report")
        return 0
    return 2
