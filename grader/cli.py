"""Instructor command line: ``python -m grader <command>``.

Commands:
  build     regenerate notebooks/ (student versions) from solutions/ with nbgrader
"""

from __future__ import annotations

import argparse
import time

from grader import course


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="regenerate notebooks/ from solutions/ with nbgrader")
    build.add_argument("lessons", nargs="*", help="lesson ids (default: all)")
    args = parser.parse_args(argv)

    if args.command == "build":
        start = time.perf_counter()
        for path in course.build_notebooks(only=args.lessons or None):
            print(f"wrote {path.relative_to(course.ROOT)}")
        print(f"built in {time.perf_counter() - start:.1f} s")
    return 0
