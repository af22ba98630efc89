"""Grade a whole class: every submission of every lesson, several at a time, resumable.

The coordinator (this module) finds the submissions nbgrader expects in
``<work>/submitted/<student>/<lesson>/<lesson>.ipynb``, skips those already
graded from the same file, hands the rest to an executor
(``grader.classroom.executors``) as self-contained jobs
(``grader.classroom.autograde.grade_job``) and alone decides what goes into
the course (``GradebookWriter``): for each finished job it writes the
autograded folder at once, then, a few jobs at a time, the gradebook
(nbgrader's own SaveAutoGrades and AssignLatePenalties on the final notebook,
in one transaction per batch, written by one process at a time: a helper
forked beside the workers where there is one, else the coordinator), then a
small JSON record per job in ``<work>/classroom/results/`` (the scores, and
the timestamp and late penalty the gradebook then held). That record is
written last, so a run killed at any point and run again grades exactly what
is missing and ends with the same gradebook. Export
(``grader.instructor.report``) reports the records and checks the gradebook
against them: a row the grading run did not write, or that changed since, is
flagged. The gradebook itself is read and written by ``grader.classroom.grades``.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from grader import course
from grader.classroom import executors, lessons, seal
from grader.classroom.grades import (
    _retry,
    course_config,  # noqa: F401 - for callers of this module
    ensure_gradebook,
    gradebook_url,
    graded_in_gradebook,
    template,
    write_grades,
)
from grader.classroom.jobs import (
    SUBMITTED_CAP,
    Job,
    JobResult,
    Options,
    default_protected,
    digest_of,
    one_line,
    read_regular,
)
from grader.classroom.servers import WORKER_MODULES, share_servers, warm_up


def results_dir() -> Path:
    return course.work_dir() / "classroom" / "results"


def record_path(lesson: str, student: str) -> Path:
    return results_dir() / lesson / f"{student}.json"


@dataclass
class Submission:
    student: str
    lesson: str
    path: Path

    @property
    def timestamp(self) -> str | None:
        """Its timestamp.txt, if a small regular file (never read through a link)."""
        with contextlib.suppress(OSError):
            return (
                read_regular(self.path.parent / "timestamp.txt", 4096).decode(errors="replace").strip()
                or None
            )
        return None

    def read(self) -> bytes:
        """The notebook's bytes: a regular file of at most SUBMITTED_CAP bytes, in the student's own folders,
        never read through a link (``OSError`` saying why: a student can put anything here)."""
        if self.path.parent.is_symlink() or self.path.parent.parent.is_symlink():
            raise OSError(f"{self.student}/{self.lesson}: a link to another folder, not a folder")
        return read_regular(self.path, SUBMITTED_CAP)

    def digest(self) -> str:
        return digest_of(self.read(), self.timestamp)


def submissions(
    only_lessons: list[str] | None = None, only_students: list[str] | None = None
) -> list[Submission]:
    """Every submitted notebook of the lessons that exist, by lesson then student."""
    found = []
    root = course.work_dir() / "submitted"
    for lesson in only_lessons or course.lessons():
        for path in sorted(root.glob(f"*/{lesson}/{lesson}.ipynb")):
            student = path.parent.parent.name
            if only_students and student not in only_students:
                continue
            found.append(Submission(student, lesson, path))
    return found


# ------------------------------------------------------------------ finished jobs into the course


def _write_files(result: JobResult, timestamp: str | None) -> None:
    dest = course.autograded_path(result.lesson, result.student)
    dest.parent.mkdir(parents=True, exist_ok=True)
    files = dict(result.files)
    files[dest.name] = result.notebook
    if timestamp and "timestamp.txt" not in files:
        files["timestamp.txt"] = timestamp.encode()
    for rel, data in files.items():
        path = dest.parent / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class GradebookWriter:
    """Puts finished jobs into the course: each one's autograded folder at once, then, a batch at a
    time, their grades into the gradebook (``write_grades``), then their records.

    A record is written only once its grades are in the gradebook, so a run killed at any point
    grades again exactly the jobs without one. Batches are written one at a time (the gradebook
    has one writer), in one transaction each: about half the CPU of writing each job on its own.
    Where the run's workers are forked from a preloaded forkserver, a helper process forked from it
    writes them (nbgrader is loaded there already); elsewhere the coordinator does, loading
    nbgrader at its first batch.
    """

    BATCH = 4  # jobs waiting that make a batch due
    WAIT = 2.0  # seconds after which fewer make one due

    def __init__(self, ex: executors.Executor, summary: RunSummary, digests: dict[str, str]) -> None:
        self.summary, self.digests = summary, digests
        self.url = gradebook_url()
        self.helper = ex.helper()
        self.waiting: list[tuple[JobResult, Submission]] = []
        self.since = 0.0  # when the oldest waiting job came
        self.writing: tuple[Any, list[tuple[JobResult, Submission]]] | None = None

    def add(self, result: JobResult, sub: Submission) -> None:
        if self.helper is None and not self.since:  # at the first job, nbgrader loads while the rest run
            threading.Thread(target=importlib.import_module, args=("nbgrader.api",), daemon=True).start()
        _write_files(result, sub.timestamp)
        if not self.waiting:
            self.since = time.monotonic()
        self.waiting.append((result, sub))
        self.step()

    def step(self, final: bool = False) -> None:
        """Take a written batch's records, and start the next batch if one is due (``final``: the
        run is ending, so write everything now and wait for it)."""
        while True:
            if self.writing is not None and (final or self.writing[0].done()):
                future, batch = self.writing
                self.writing = None
                try:
                    written = future.result()
                except Exception:  # noqa: BLE001 - the helper failed: write them here, one by one
                    written = [self._write([job])[0] for job in batch]
                self._recorded(batch, written)
            due = self.waiting and (
                final or len(self.waiting) >= self.BATCH or time.monotonic() - self.since >= self.WAIT
            )
            if self.writing is not None or not due:
                return
            batch, self.waiting = self.waiting, []
            if self.helper is None:
                self._recorded(batch, self._write(batch))
                continue
            from concurrent.futures import Future

            try:
                future = self.helper.submit(_retry, write_grades, self.url, None, _entries(batch))
            except Exception as e:  # noqa: BLE001 - no helper any more: its result is the failure
                future = Future()
                future.set_exception(e)
            self.writing = (future, batch)
            if not final:
                return

    def _write(self, batch: list[tuple[JobResult, Submission]]) -> list[dict]:
        return _retry(write_grades, self.url, None, _entries(batch))

    def _recorded(self, batch: list[tuple[JobResult, Submission]], written: list[dict]) -> None:
        for (result, sub), held in zip(batch, written):
            record = result.summary()
            record.update(
                lesson_digest=self.digests[sub.lesson],
                graded_at=datetime.datetime.now().isoformat(timespec="seconds"),
                timestamp=held.get("timestamp"),
                late_penalty=held.get("late_penalty", 0.0),
            )
            _write_record(record)
            s = self.summary
            s.graded += 1
            s.by_status[result.status] = s.by_status.get(result.status, 0) + 1
            if result.isolation.startswith("not sealed"):
                s.not_sealed = result.isolation.partition(": ")[2] or "unknown reason"
            if result.flags:
                s.flagged.append({"student": sub.student, "lesson": sub.lesson, "flags": result.flags})


def _entries(batch: list[tuple[JobResult, Submission]]) -> list[tuple[str, str, str | None, bytes]]:
    return [(r.lesson, r.student, sub.timestamp, r.notebook) for r, sub in batch]


def _write_record(record: dict) -> None:
    path = record_path(record["lesson"], record["student"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


def record_failure(result: JobResult, lesson_digest: str) -> None:
    """A submission that could not be graded still has a record (status "grading failed"), so it is
    listed by export and the class report; the next run grades it again."""
    record = result.summary()
    record.update(
        status="grading failed",
        score=0.0,
        max_score=lessons.lesson(result.lesson).max_score,
        error=(result.error or "")[-2000:],
        lesson_digest=lesson_digest,
        graded_at=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    _write_record(record)


def already_graded(sub: Submission, lesson_digest: str, in_gradebook: set[tuple[str, str]]) -> bool:
    path = record_path(sub.lesson, sub.student)
    if not path.exists() or (sub.student, sub.lesson) not in in_gradebook:
        return False
    if not course.autograded_path(sub.lesson, sub.student).exists():
        return False
    try:
        record = json.loads(path.read_text())
        digest = sub.digest()
    except (OSError, ValueError):
        return False
    return (
        record.get("digest") == digest
        and record.get("lesson_digest") == lesson_digest
        and record.get("status") != "grading failed"
    )


def load_records(only_lessons: list[str] | None = None) -> list[dict]:
    """Every grading record, by lesson then student."""
    out = []
    for lesson in only_lessons or course.lessons():
        for path in sorted((results_dir() / lesson).glob("*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
    return out


# ------------------------------------------------------------------ a run


@dataclass
class RunSummary:
    total: int = 0
    graded: int = 0
    skipped: int = 0
    seconds: float = 0.0
    workers: int = 0
    executor: str = "local"
    by_status: dict[str, int] = field(default_factory=dict)
    flagged: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    interrupted: bool = False
    # lesson -> why its own solution did not earn full marks here (then nothing is graded)
    cannot_grade: dict[str, str] = field(default_factory=dict)
    not_sealed: str = (
        ""  # why student code ran without the bubblewrap seal (grader.classroom.seal), if it did
    )
    memory: str = ""  # how workers and memory caps were fitted to this machine's memory, if they were

    @property
    def per_minute(self) -> float:
        return 60.0 * self.graded / self.seconds if self.seconds > 0 else 0.0


# ------------------------------------------------------------------ proving the run can grade

# the name a lesson's own solution is graded under before the class (never written to the gradebook)
PROOF_STUDENT = "course-own-solution"


def _fingerprint(lesson_id: str, lesson_digest: str, options: Options) -> str:
    """What a proof holds for: the lesson, the grading code and settings, this environment and where
    its kernels import the course package from."""
    import hashlib
    import importlib.metadata
    import importlib.util
    import sys

    h = hashlib.sha256()
    spec = importlib.util.find_spec("attention_course")
    origin = spec.origin if spec and spec.origin else "missing"
    versions = []
    for dist in ("torch", "nbgrader", "nbclient", "ipykernel"):
        try:
            versions.append(importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            versions.append("missing")
    settings = (options.timeout, options.memory, options.notebook_timeout)
    for part in (
        lesson_id,
        lesson_digest,
        sys.executable,
        str(course.ROOT),
        origin,
        *versions,
        str(settings),
    ):
        h.update(part.encode() + b"\0")
    h.update(str(seal.available()).encode())
    code = [course.ROOT / "nbgrader_config.py", *sorted((course.ROOT / "grader").rglob("*.py"))]
    if origin != "missing":
        code += sorted(Path(origin).parent.rglob("*.py"))
    for path in code:
        h.update(path.read_bytes())
    return h.hexdigest()[:32]


def _proofs_path() -> Path:
    """Where this user's proofs are remembered (each names its course folder and environment)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attention-course" / "proven.json"


def _known_proofs() -> list[str]:
    try:
        known = json.loads(_proofs_path().read_text())
    except (OSError, ValueError):
        return []
    return [str(fp) for fp in known] if isinstance(known, list) else []


def _unproven(lesson_ids: list[str], digests: dict[str, str], options: Options) -> dict[str, str]:
    """The lessons whose solution has not yet earned full marks here, as things are: id -> fingerprint."""
    known = set(_known_proofs())
    wanted = {lid: _fingerprint(lid, digests[lid], options) for lid in lesson_ids}
    return {lid: fp for lid, fp in wanted.items() if fp not in known}


def _proven(fingerprint: str) -> None:
    known = [fp for fp in _known_proofs() if fp != fingerprint][-499:] + [fingerprint]
    try:
        _proofs_path().parent.mkdir(parents=True, exist_ok=True)
        tmp = _proofs_path().with_name(f"proven.json.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, _proofs_path())
    except OSError:
        pass  # nothing remembered: the next run proves again


def proof_problem(result: JobResult | BaseException) -> str | None:
    """Why a lesson's own solution did not earn full marks (None if it did)."""
    if isinstance(result, BaseException):
        return f"its grading failed: {result!r}"
    if result.error:
        lines = [ln for ln in result.error.strip().splitlines() if ln.strip()]
        return lines[-1] if lines else "its grading failed"
    if result.score < result.max_score:
        lost = [c for c in result.cells if c.score < c.points]
        first = lost[0] if lost else None
        why = f" ({first.grade_id}: {first.message.splitlines()[0][:300]})" if first and first.message else ""
        return f"it earned {result.score:g} of {result.max_score:g} points{why}"
    return None


def cannot_grade_message(problems: dict[str, str]) -> str:
    lines = [
        "Nothing was graded: the lesson's own solution, graded first the way every submission is, did not "
        "earn full marks, so this run would score students for the course's fault, not theirs."
    ]
    lines += [f"  {lid}: {why}" for lid, why in sorted(problems.items())]
    lines.append(
        "Check that the environment's `attention_course` is this course folder's (pip install -e . here), "
        "that `python -m grader build` was run after editing solutions/, then run grade again."
    )
    return "\n".join(lines)


def grade_one(job: Job) -> JobResult:
    """Grade one job (what a worker runs): ``grader.classroom.autograde.grade_job``, imported here so
    that the coordinator, which only names this function, does not load nbgrader to hand out jobs."""
    from grader.classroom.autograde import grade_job

    return grade_job(job)


def _job_stream(todo: list[Submission], template_bytes: bytes, options: Options, unreadable: list):
    """Each submission's job, read as the executor asks for it; one that cannot be read goes to
    ``unreadable`` with the reason (it could not be graded: no score)."""
    for sub in todo:
        try:
            data = sub.read()
        except OSError as e:
            unreadable.append((sub, f"could not be graded: the submission was not read ({e})"))
            continue
        ts = sub.timestamp
        yield Job(sub.student, sub.lesson, data, template_bytes, ts, digest_of(data, ts), options)


SUBMISSIONS_PER_WORKER = 8  # by default, no more workers than one per this many submissions (but two, sealed)


def default_worker_count(submissions: int) -> int:
    """Local workers: one per core and per SUBMISSIONS_PER_WORKER submissions, but two where the seal works:
    two share fork servers the run starts at once, and a lesson's proof is graded beside the class."""
    most = -(-submissions // SUBMISSIONS_PER_WORKER)
    return min(executors.default_workers(), max(most, 2) if seal.available()[0] else most)


# a job may run this much longer than its notebook's time limit (the checks, nbgrader's own steps)
# before its worker is stopped and the submission reported "could not be graded: timed out"
JOB_GRACE = 120


def grade(
    only_lessons: list[str] | None = None,
    only_students: list[str] | None = None,
    *,
    options: Options | None = None,
    workers: int | None = None,
    executor: str = "local",
    address: str | None = None,
    force: bool = False,
    progress: bool | Any = True,
    limit: int | None = None,
) -> RunSummary:
    """Autograde every submission not graded yet (``force``: all of them); return a summary.

    ``workers``: submissions graded at once (default: ``default_worker_count``).

    ``progress``: True for a bar on stderr, False for none, or a text stream to write it to.
    """
    from grader.classroom.progress import Progress

    refusal = seal.unsealed_refusal()
    if refusal is not None:
        raise RuntimeError(refusal)
    options = options or Options()
    if not options.protect:
        options.protect = default_protected()
    course.ensure_tools_on_path()
    lesson_ids = only_lessons or course.lessons()
    subs = submissions(lesson_ids, only_students)
    digests = {lid: lessons.digest(lid) for lid in lesson_ids}
    in_gb = graded_in_gradebook()  # (recording lessons below adds no submission to it)
    todo = [s for s in subs if force or not already_graded(s, digests[s.lesson], in_gb)]
    if limit is not None:
        todo = todo[:limit]
    summary = RunSummary(total=len(subs), skipped=len(subs) - len(todo), executor=executor)
    if not todo:
        ensure_gradebook(lesson_ids)
        return summary
    start = time.perf_counter()
    if executor == "local":  # the notebooks graded at once fit in this machine's memory together
        workers, memory, summary.memory = executors.fit_memory(
            workers or default_worker_count(len(todo)), options.memory, executors.available_memory()
        )
        options = replace(options, memory=memory)
    # workers forked from a preloaded forkserver start sooner; without the seal, a kernel could reach
    # that forkserver's socket (and have it fork what it likes), so its workers are spawned instead
    preload = WORKER_MODULES if seal.available()[0] else ()
    ex = executors.make(executor, workers, address, initializer=warm_up, preload=preload)
    summary.workers = ex.workers
    bar = None
    # the local workers share one fork server of each kind (started before them: they inherit the addresses)
    shared = share_servers(ex.workers) if executor == "local" else []
    writer = None
    try:
        ex.start(len(todo))  # the workers start their fork servers while the gradebook and config are read
        ensure_gradebook(lesson_ids)
        writer = GradebookWriter(ex, summary, digests)
        template_bytes = template()
        by_key = {(s.student, s.lesson): s for s in todo}
        bar = Progress(len(todo), stream=None if progress is True else progress) if progress else None
        job_deadline = options.notebook_timeout + JOB_GRACE
        # each lesson's own solution goes first, through the same workers and seal; the class's results
        # wait for it, and if it does not earn full marks, nothing is written and the run stops
        unproven = _unproven(sorted({s.lesson for s in todo}), digests, options)
        proofs = [
            Job(PROOF_STUDENT, lid, nb, template_bytes, None, digest_of(nb, None), options)
            for lid, nb in ((lid, lessons.answered(lid)) for lid in unproven)
        ]
        waiting: list[tuple[JobResult, Submission]] = []
        unreadable: list[tuple[Submission, str]] = []
        stream = itertools.chain(proofs, _job_stream(todo, template_bytes, options, unreadable))
        for job, result in ex.run(grade_one, stream, deadline=job_deadline):
            if any(job is proof for proof in proofs):
                problem = proof_problem(result)
                if problem is not None:
                    summary.cannot_grade[job.lesson] = problem
                    break
                _proven(unproven.pop(job.lesson))
                if not unproven:
                    for held, sub in waiting:
                        _finish(held, sub, writer, summary, digests[sub.lesson])
                    waiting = []
                continue
            sub = by_key[(job.student, job.lesson)]
            if isinstance(result, BaseException):
                result = JobResult(job.student, job.lesson, job.digest, "grading failed", error=repr(result))
            if unproven:
                waiting.append((result, sub))
            else:
                _finish(result, sub, writer, summary, digests[sub.lesson])
            if bar:
                bar.update(f"{sub.student}/{sub.lesson}", problem=bool(result.flags or result.error))
        if summary.cannot_grade:
            return summary
        for sub, why in unreadable:
            failed = JobResult(sub.student, sub.lesson, "", "could not be graded", error=why)
            _finish(failed, sub, writer, summary, digests[sub.lesson])
        writer.step(final=True)
    except KeyboardInterrupt:
        summary.interrupted = True
        if writer is not None:  # what was graded before Ctrl-C is kept (a second Ctrl-C gives it up)
            with contextlib.suppress(KeyboardInterrupt):
                writer.step(final=True)
    finally:
        ex.close()
        for server in shared:
            server.close()
        if bar:
            bar.close()
        summary.seconds = time.perf_counter() - start
    return summary


def _finish(
    result: JobResult, sub: Submission, writer: GradebookWriter, summary: RunSummary, digest: str
) -> None:
    """A class job's result into the course: its gradebook batch, or its failure record."""
    if result.error is None and result.notebook is not None:
        writer.add(result, sub)
    else:
        summary.failed.append({"student": sub.student, "lesson": sub.lesson, "error": result.error})
        record_failure(result, digest)


def format_summary(s: RunSummary) -> str:
    if s.cannot_grade:
        return cannot_grade_message(s.cannot_grade)
    lines = []
    head = f"Graded {s.graded} submission{'s' if s.graded != 1 else ''}"
    if s.graded:
        head += f" in {s.seconds:.0f} s ({s.per_minute:.1f} notebooks/min, {s.workers} worker{'s' * (s.workers != 1)}, {s.executor})"
    if s.skipped:
        head += f"; {s.skipped} already graded from the same file, skipped"
    lines.append(head + ".")
    if s.memory:
        lines.append(s.memory)
    if s.not_sealed:
        lines.append(
            f"NOT SEALED ({s.not_sealed}): student code ran without the bubblewrap boundary, "
            "under the in-process guard only (install bubblewrap to seal it)."
        )
    if s.interrupted:
        lines.append("Interrupted: run the same command again to grade the rest.")
    if s.by_status:
        order = sorted(s.by_status.items(), key=lambda kv: (kv[0] != "graded", kv[0]))
        lines.append("  " + " | ".join(f"{k}: {v}" for k, v in order))
    if s.flagged:
        lines.append("Flagged for review (signs of tampering; scores come from the independent checks):")
        for f in s.flagged:
            lines.append(one_line(f"  {f['student']} / {f['lesson']}: " + "; ".join(f["flags"])))
    if s.failed:
        lines.append("Could not be graded (run again to retry; details in the records):")
        for f in s.failed:
            first = (f.get("error") or "").strip().splitlines() or ["unknown error"]
            lines.append(one_line(f"  {f['student']} / {f['lesson']}: {first[-1]}"))
    return "\n".join(lines)
