"""An operating-system boundary around student code: a bubblewrap (``bwrap``) command line.

Every process that runs a student's code while a notebook is graded (its kernel, and the sandbox the
trusted checks call) starts in new mount, PID, network and IPC namespaces that show only, read-only,
the Python installation, the system's ``/usr`` and a few files of ``/etc``, the student helpers
(``attention_course/``, its explorers replaced by the stand-in ``graded_explorers``) and ``data/``,
and the runtime that starts kernels and sandboxes (``RUNTIME_MODULES``, as the package
``course_runtime``); writable, only the folders given (the grading area), a private ``/tmp``, and
``/dev/nvidia*`` where a GPU is present. ``grader/``, ``solutions/`` and the work folder do not
exist there; there is no network, and the environment is rebuilt from a short list.

Where bwrap is missing or cannot create namespaces (macOS, locked-down containers), grading stops
and says why, unless the instructor asked for the in-process guard alone with
``ATTENTION_COURSE_NO_SEAL=1`` (in the environment, or set in nbgrader_config.py); then every result
says "not sealed".
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OFF_VARIABLE = "ATTENTION_COURSE_NO_SEAL"
RUNTIME = "/opt/course_runtime"  # where the runtime package is mounted inside the seal
RUNTIME_PACKAGE = "course_runtime"
RUNTIME_MODULES = tuple(
    "__init__.py guard.py sandbox.py wire.py fork_server.py seccomp.py boundary.py".split()
)
SEALED = "sealed"
NOT_SEALED = "not sealed"

# files and folders of /etc that Python, torch and matplotlib read (when present)
ETC = tuple(
    "ld.so.cache ld.so.conf ld.so.conf.d passwd group nsswitch.conf localtime timezone fonts ssl "
    "ca-certificates alternatives mime.types host.conf hosts matplotlibrc".split()
)
# variables a sealed process may inherit (everything else is dropped)
KEPT_ENV = tuple(
    "LANG LC_ALL TZ MPLBACKEND OMP_NUM_THREADS MKL_NUM_THREADS CUDA_VISIBLE_DEVICES NBGRADER_EXECUTION TMPDIR "
    "IPYTHONDIR ATTENTION_COURSE_DATA PYTHONHASHSEED".split()
)


def short_tmp() -> str:
    """A temporary folder with a short path: a kernel's IPC sockets live below it (at most 107 bytes)."""
    default = tempfile.gettempdir()
    if len(default) <= 24 or not os.access("/tmp", os.W_OK):
        return default
    return "/tmp"


def repo_root() -> Path:
    """The repository (installed editable: hidden inside the seal but for the student helpers and data)."""
    return Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def _trial() -> tuple[bool, str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "bubblewrap (bwrap) is not installed"
    try:
        cmd = command(["/bin/true"], writable=[], cwd="/")
        done = subprocess.run(cmd, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap could not run ({type(e).__name__}: {e})"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        return False, f"bwrap refused to create namespaces ({why[-1] if why else done.returncode})"
    return True, "bubblewrap"


def available() -> tuple[bool, str]:
    """Whether student code can be sealed here, and why not when it cannot."""
    if os.environ.get(OFF_VARIABLE, "").strip() not in ("", "0"):
        return False, f"turned off by {OFF_VARIABLE}"
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap needs Linux (this is {sys.platform})"
    return _trial()


def unsealed_refusal() -> str | None:
    """Why grading may not start here (the seal does not work and nobody asked to grade without it),
    or None when it may (sealed, or unsealed on purpose)."""
    ok, why = available()
    if ok or os.environ.get(OFF_VARIABLE, "").strip() not in ("", "0"):
        return None
    return (
        f"{NOT_SEALED.upper()} ({why}): student code would run without the bubblewrap boundary, under "
        f"an in-process guard that is not a sandbox. Install bubblewrap (Debian/Ubuntu: apt-get install "
        f"bubblewrap), or, to grade without it on purpose (macOS, a container without namespaces), set "
        f"{OFF_VARIABLE}=1 in the environment (for plain nbgrader, nbgrader_config.py may set it)."
    )


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
    stand_in = graded_explorers()
    for package in student_packages():
        if (package / EXPLORERS).is_dir():
            args += ["--ro-bind", stand_in, str(package / EXPLORERS)]
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
    args += _passable_parents(args)
    args += ["--clearenv"]
    for name, value in sealed_env(env).items():
        args += ["--setenv", name, value]
    args += ["--chdir", os.path.realpath(cwd), "--"]
    return args + list(argv)


def _passable_parents(args: list[str]) -> list[str]:
    """``--chmod 0755`` for each folder bubblewrap makes on the way to a mount point (it makes them
    0700): a notebook's unprivileged user must pass through them to the Python installation.
    A folder that is bound from the host, or lies inside one, is not bubblewrap's to change."""
    targets, bound = set(), set()
    for i, flag in enumerate(args):
        if flag in ("--bind", "--ro-bind", "--dev-bind", "--symlink"):
            targets.add(args[i + 2])
            bound.add(args[i + 2])
        elif flag in ("--tmpfs", "--dir", "--proc", "--dev"):
            targets.add(args[i + 1])
    made = {parent for t in targets for parent in _parents(t)}
    out: list[str] = []
    for d in sorted(made, key=lambda d: d.count("/")):
        if not any(d == b or d.startswith(b + "/") for b in bound):
            out += ["--chmod", "0755", d]
    return out


def _parents(path: str) -> list[str]:
    """The folders above ``path``, ``/`` left out."""
    out = []
    parent = os.path.dirname(path)
    while parent not in ("/", ""):
        out.append(parent)
        parent = os.path.dirname(parent)
    return out


def _font_caches() -> list[str]:
    home = Path.home()
    folders = [
        os.environ.get("MPLCONFIGDIR"),
        home / ".cache" / "matplotlib",
        home / ".config" / "matplotlib",
    ]
    found: dict[str, str] = {}
    for folder in folders:
        try:  # a home this user may not enter has no cache to share
            names = sorted(Path(folder).glob("fontlist-*.json")) if folder and Path(folder).is_dir() else []
        except OSError:
            continue
        for f in names:
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


# ------------------------------------------------------------------ the explorers while graded

HELPERS = "attention_course"
EXPLORERS = "explorers"
GRADED_TEXT = "{title}: not shown while the notebook is being graded."  # what Skipped says (explorers.base)

STAND_IN = '''"""The course's explorers while a notebook is being graded: each says so and computes nothing.

Made by the grading tool from the explorers' entry points: while a notebook is graded
nothing else of the explorers exists.
"""

__all__ = {names!r}

_TITLES = {titles!r}


class _Skipped:
    """What an explorer returns while a notebook is being graded."""

    kind = "explorer"

    def __init__(self, title):
        self.title = title
        self.text = {text!r}.format(title=title)
        self.widget = None
        self.controls = {{}}
        self.state = None

    def _ipython_display_(self):
        from IPython.display import display

        display({{"text/plain": self.text}}, raw=True, metadata=None)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{"text/plain": self.text}}

    def __repr__(self):
        return self.text


def _explorer(name):
    def explorer(*args, **kwargs):
        return _Skipped(_TITLES[name])

    explorer.__name__ = explorer.__qualname__ = name
    return explorer


{definitions}
'''


def student_packages() -> list[Path]:
    """Where the student helpers are found inside the seal (the repository's copy, an installed one)."""
    found = [repo_root() / HELPERS]
    spec = importlib.util.find_spec(HELPERS)
    for location in (spec.submodule_search_locations or []) if spec else []:
        found.append(Path(location))
    out: list[Path] = []
    for p in found:
        p = Path(os.path.realpath(p))
        if p.is_dir() and p not in out:
            out.append(p)
    return out


def _class_title(module: Path, name: str) -> str | None:
    """The ``title = "..."`` of class ``name`` in a module of the explorers."""
    if not module.is_file():
        return None
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == name:
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and any(getattr(t, "id", "") == "title" for t in item.targets)
                    and isinstance(item.value, ast.Constant)
                ):
                    return str(item.value.value)
    return None


def _skipped_title(function: ast.FunctionDef, package: Path) -> str | None:
    """The title an entry point gives ``Skipped(...)``: a string, or ``SomeExplorer.title`` from its module."""
    imported = {
        a.asname or a.name: node.module
        for node in ast.walk(function)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for a in node.names
    }
    for node in ast.walk(function):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "Skipped"
            and node.args
        ):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.Attribute) and arg.attr == "title" and isinstance(arg.value, ast.Name):
            module = imported.get(arg.value.id)
            if module:
                return _class_title(package / f"{module.replace('.', '/')}.py", arg.value.id)
    return None


def explorer_titles(package: Path) -> dict[str, str]:
    """Each explorer entry point (``__all__`` of ``attention_course.explorers``) and its title, read from source.

    The title is what the entry point hands ``Skipped`` while a notebook is graded; a
    name whose title cannot be read gets its name in words.
    """
    init = package / "__init__.py"
    if not init.is_file():
        return {}
    tree = ast.parse(init.read_text())
    names: list[str] = []
    functions: dict[str, ast.FunctionDef] = {}
    aliases: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
        elif isinstance(node, ast.Assign):
            targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if "__all__" in targets:
                names = [str(n) for n in ast.literal_eval(node.value)]
            elif isinstance(node.value, ast.Name):
                aliases.update({t: node.value.id for t in targets})
    titles = {}
    for name in names:
        function = functions.get(aliases.get(name, name))
        title = _skipped_title(function, package) if function is not None else None
        titles[name] = title or name.replace("_", " ").capitalize()
    return titles


@functools.lru_cache(maxsize=1)
def _stand_in_text() -> str:
    """The ``__init__.py`` of the explorers' stand-in: each entry point returns what it shows while graded."""
    titles: dict[str, str] = {}
    for package in student_packages():
        titles = titles or explorer_titles(package / EXPLORERS)
    definitions = "\n".join(f"{name} = _explorer({name!r})" for name in titles)
    return STAND_IN.format(names=list(titles), titles=titles, text=GRADED_TEXT, definitions=definitions)


def graded_explorers() -> str:
    """The folder that the seal shows in place of ``attention_course/explorers``.

    Named by its content and never removed (it is one small file), so every process
    that grades finds it, whichever process made it; checked, and made again if it is
    missing or not exactly the stand-in, at every use.
    """
    import hashlib

    text = _stand_in_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    top = Path(short_tmp()) / f"graded-explorers-{os.getuid()}-{digest}"
    init = top / EXPLORERS / "__init__.py"
    if _is_stand_in(top, init, text):
        return str(init.parent)
    if top.is_dir() and not top.is_symlink() and top.stat().st_uid == os.getuid():
        shutil.rmtree(top, ignore_errors=True)  # ours, but not the stand-in (changed or half made)
    made = Path(_private_stand_in(text)).parent
    try:
        os.rename(made, top)  # atomic: one process wins, the others find its copy
    except OSError:
        shutil.rmtree(made, ignore_errors=True)
    if _is_stand_in(top, init, text):
        return str(init.parent)
    return _private_stand_in(text)


def _is_stand_in(top: Path, init: Path, text: str) -> bool:
    """Whether ``top`` is a real folder of ours holding exactly the stand-in."""
    try:
        st = top.lstat()
        return not top.is_symlink() and st.st_uid == os.getuid() and init.read_text() == text
    except OSError:
        return False


def _private_stand_in(text: str) -> str:
    """A copy only this call uses (when the shared one cannot be made or trusted)."""
    made = Path(tempfile.mkdtemp(prefix=".graded-explorers-", dir=short_tmp()))
    (made / EXPLORERS).mkdir()
    (made / EXPLORERS / "__init__.py").write_text(text)
    return str(made / EXPLORERS)
