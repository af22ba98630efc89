"""An operating-system boundary around student code: a bubblewrap (``bwrap``) command line.

Every process that runs a student's code while a notebook is graded (the
Jupyter kernel and the sandbox the trusted checks call) starts inside a fresh
mount, PID, network and IPC namespace that shows only:

- the Python installation (``sys.prefix``, the base prefix) and the system's
  ``/usr`` with a few files of ``/etc``, all read-only;
- the student helpers (``attention_course/``) and ``data/``, read-only: the
  repository itself stays hidden, so neither ``grader/`` nor ``solutions/``
  nor the work folder (gradebook, other submissions) exists there;
- the small runtime that starts kernels and sandboxes (guard, sandbox, fork
  server), read-only, as the package ``course_runtime``;
- the folders given as writable (the submission's own working folder), a
  private ``/tmp``, and ``/dev/nvidia*`` when a GPU is present.

There is no network (kernels talk to nbclient over IPC sockets in a bound
folder), the environment is rebuilt from a short list, and everything in the
PID namespace dies with it. Where bwrap is missing or cannot create namespaces
(macOS, locked-down containers), or with ``ATTENTION_COURSE_NO_SEAL=1``,
grading falls back to the in-process guard alone and every result says
"not sealed".
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

OFF_VARIABLE = "ATTENTION_COURSE_NO_SEAL"
RUNTIME = "/opt/course_runtime"  # where the runtime package is mounted inside the seal
RUNTIME_PACKAGE = "course_runtime"
RUNTIME_MODULES = ("__init__.py", "guard.py", "sandbox.py", "fork_server.py", "kernel_launcher.py")
SEALED = "sealed"
NOT_SEALED = "not sealed"

# files and folders of /etc that Python, torch and matplotlib read (when present)
ETC = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "timezone",
    "fonts",
    "ssl",
    "ca-certificates",
    "alternatives",
    "mime.types",
    "host.conf",
    "hosts",
    "matplotlibrc",
)
# variables a sealed process may inherit (everything else is dropped)
KEPT_ENV = (
    "LANG",
    "LC_ALL",
    "TZ",
    "MPLBACKEND",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NBGRADER_EXECUTION",
    "TMPDIR",
    "IPYTHONDIR",
    "ATTENTION_COURSE_DATA",
    "PYTHONHASHSEED",
)


def short_tmp() -> str:
    """A temporary folder with a short path: a kernel's IPC sockets live below it (at most 107 bytes)."""
    import tempfile

    default = tempfile.gettempdir()
    if len(default) <= 24 or not os.access("/tmp", os.W_OK):
        return default
    return "/tmp"


def repo_root() -> Path:
    """The repository (installed editable: hidden inside the seal but for the student helpers and data)."""
    return Path(__file__).resolve().parents[2]


def _trial() -> tuple[bool, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "bubblewrap (bwrap) is not installed"
    cmd = command(["/bin/true"], writable=[], cwd="/")
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap could not run ({type(e).__name__}: {e})"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        return False, f"bwrap refused to create namespaces ({why[-1] if why else done.returncode})"
    return True, "bubblewrap"


@functools.lru_cache(maxsize=1)
def _cached_trial() -> tuple[bool, str]:
    return _trial()


def available() -> tuple[bool, str]:
    """Whether student code can be sealed here, and why not when it cannot."""
    if os.environ.get(OFF_VARIABLE, "").strip() not in ("", "0"):
        return False, f"turned off by {OFF_VARIABLE}"
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap needs Linux (this is {sys.platform})"
    return _cached_trial()


def status() -> str:
    """'sealed', or 'not sealed: <reason>' (what each job result records)."""
    ok, why = available()
    return SEALED if ok else f"{NOT_SEALED}: {why}"


def _bind_existing(flag: str, path: str, args: list[str], seen: set[str]) -> None:
    p = os.path.abspath(path)
    if p in seen or not os.path.exists(p):
        return
    seen.add(p)
    if os.path.islink(p):  # /lib -> usr/lib on merged-/usr systems
        args += ["--symlink", os.readlink(p), p]
    else:
        args += [flag, p, p]


def python_paths() -> list[str]:
    """The Python installation this process runs on (prefixes and site-packages)."""
    import site
    import sysconfig

    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"]]
    paths += site.getsitepackages()
    real = os.path.realpath(sys.executable)
    paths.append(os.path.dirname(os.path.dirname(real)))
    return sorted({os.path.abspath(p) for p in paths if p and os.path.exists(p)})


def command(
    argv: list[str],
    *,
    writable: list[str],
    cwd: str,
    env: dict[str, str] | None = None,
    readable: list[str] | None = None,
) -> list[str]:
    """The bwrap command line that runs argv sealed, with only the writable folders open for writing."""
    root = repo_root()
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
    ]
    args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "grading"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--dir", "/var/tmp"]
    seen: set[str] = set()
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        _bind_existing("--ro-bind", top, args, seen)
    for name in ETC:
        _bind_existing("--ro-bind", f"/etc/{name}", args, seen)
    _bind_existing("--ro-bind", "/sys", args, seen)  # CPU topology for torch, PCI for CUDA
    # the repository is hidden; only what students receive is shown again
    args += ["--tmpfs", str(root)]
    for p in python_paths():
        _bind_existing("--ro-bind", p, args, seen)
    for name in ("attention_course", "data"):
        _bind_existing("--ro-bind", str(root / name), args, seen)
    if os.environ.get("ATTENTION_COURSE_DATA"):
        _bind_existing("--ro-bind", os.environ["ATTENTION_COURSE_DATA"], args, seen)
    for p in readable or []:
        _bind_existing("--ro-bind", p, args, seen)
    here = Path(__file__).resolve().parent
    args += ["--dir", f"{RUNTIME}/{RUNTIME_PACKAGE}"]
    for name in RUNTIME_MODULES:
        args += ["--ro-bind", str(here / name), f"{RUNTIME}/{RUNTIME_PACKAGE}/{name}"]
    for dev in sorted(Path("/dev").glob("nvidia*")):
        args += ["--dev-bind", str(dev), str(dev)]
    for p in writable:
        args += ["--bind", os.path.realpath(p), os.path.realpath(p)]
    for cache in _font_caches():  # matplotlib's font list, so no cell pays (and prints) its rebuild
        args += ["--ro-bind", cache, f"/tmp/matplotlib/{os.path.basename(cache)}"]
    args += ["--clearenv"]
    for name, value in sealed_env(env).items():
        args += ["--setenv", name, value]
    args += ["--chdir", os.path.realpath(cwd), "--"]
    return args + list(argv)


def _font_caches() -> list[str]:
    home = Path.home()
    folders = [
        os.environ.get("MPLCONFIGDIR"),
        home / ".cache" / "matplotlib",
        home / ".config" / "matplotlib",
    ]
    found: dict[str, str] = {}
    for folder in folders:
        if folder and Path(folder).is_dir():
            for f in sorted(Path(folder).glob("fontlist-*.json")):
                found.setdefault(f.name, str(f))
    return list(found.values())


def sealed_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment inside the seal: a short list of variables, never the work folder's."""
    source = env if env is not None else os.environ
    out = {k: source[k] for k in KEPT_ENV if k in source}
    out["PATH"] = f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
    out["HOME"] = "/tmp"
    out["PYTHONPATH"] = RUNTIME
    out["PYTHONDONTWRITEBYTECODE"] = "1"
    out["MPLCONFIGDIR"] = "/tmp/matplotlib"
    out.setdefault("LANG", "C.UTF-8")
    out.setdefault("TMPDIR", "/tmp")
    if sys.prefix != sys.base_prefix:
        out["VIRTUAL_ENV"] = sys.prefix
    return out
