"""Signs of tampering in a student's code, found by reading it (never by running it).

These only flag a submission for review: scores never depend on them (the
verdicts are re-decided outside the kernel). Each sign is one readable
sentence, e.g. "patches torch.isclose", "mentions the grading package" or
"uses the course's helper code as an answer (project)": a graded function that is,
or wraps, code of the student helpers earns nothing from the hidden checks anyway
(release proves no helper passes one, and under the seal the explorers' internals do
not exist while a notebook is graded), and the flag says why.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib.util
import re
from pathlib import Path

# modules whose attributes a submission has no business replacing
PROTECTED = set(
    "numpy torch math cmath builtins operator grader attention_course unittest numbers IPython nbgrader "
    "functools warnings traceback".split()
)
# built-in names whose rebinding looks like an attempt to fool a check
WATCHED_BUILTINS = set(
    "isinstance issubclass AssertionError BaseException Exception bool callable type hasattr getattr setattr "
    "__import__ __builtins__ compile exec eval float abs all any".split()
)
TEXT_SIGNS = [
    (re.compile(r"\bgrader\b"), "mentions the grading package (grader)"),
    (re.compile(r"gradebook", re.I), "mentions the gradebook"),
    (re.compile(r"\bnbgrader\b"), "mentions nbgrader"),
    (re.compile(r"\bsqlite3\b"), "opens a database (sqlite3)"),
    (re.compile(r"\bctypes\b"), "loads native code (ctypes)"),
    (
        re.compile(r"\b(set_custom_exc|showtraceback|excepthook|InteractiveShell)\b"),
        "changes how errors are reported",
    ),
    (
        re.compile(r"\b(_getframe|currentframe|f_back|f_globals|f_locals|get_referrers|get_objects)\b"),
        "inspects the caller's frames or memory",
    ),
    (re.compile(r"\b(meta_path|path_hooks)\b"), "changes the import system"),
    (
        re.compile(r"sys\.modules\s*(\[[^\]]*\]\s*=|\.(update|pop|setdefault|__setitem__))"),
        "replaces a module in sys.modules",
    ),
    (re.compile(r"\bdel\s+sys\.modules\b"), "replaces a module in sys.modules"),
    (
        re.compile(
            r"\b(\w*subprocess|Popen|os\.system|os\.popen|os\.fork|os\.spawn\w*|os\.exec\w*|posix_spawn\w*|pty)\b"
        ),
        "starts other programs",
    ),
    (re.compile(r"\b(socket|http\.client|requests)\b"), "opens network connections"),
    # the watch that enforces a lesson's rules (no torch.softmax, ...) is a torch function mode:
    # code that turns modes off can call a forbidden function unseen, so it is flagged for a look
    (
        re.compile(
            r"\b(DisableTorchFunction|_DisableTorchDispatch|_disable_current_modes|_pop_torch_function_stack"
            r"|_pop_mode|_set_torch_function_mode|_len_torch_function_stack|_get_current_dispatch_mode\w*"
            r"|_get_current_function_mode\w*|custom_op|torch\.library|_get_\w+_stack_at|_unsafe_set_version\w*)\b"
        ),
        "turns off the course's watch on torch calls (the lesson's rules)",
    ),
]


HELPERS = "attention_course"
# what lessons import from the helpers on purpose: data, visible checks and the explorers' entry points
HELPERS_ALLOWED = ("attention_course.checks", "attention_course.data")
EXPLORERS = "attention_course.explorers"


@functools.cache
def explorer_entry_points() -> frozenset[str]:
    """The explorers' entry points: the names in ``attention_course.explorers.__all__`` (read, not imported)."""
    spec = importlib.util.find_spec(HELPERS)
    init = Path(next(iter(spec.submodule_search_locations))) / "explorers" / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _answer_sign(name: str) -> str:
    return f"uses the course's helper code as an answer ({name})"


def _internals_sign(module: str) -> str:
    return f"imports the explorers' internals ({module})"


COMPUTED_IMPORT = "imports a module by a computed name"
# calls that import a module named by a string (``__import__`` itself is caught by its plain name)
IMPORTERS = ("importlib.import_module", "importlib.__import__", "builtins.__import__")


def graded_names() -> frozenset[str]:
    """The name of every graded function of the course: the functions its solution cells define.

    Read from the lessons' source notebooks rather than from ``grader.registry``, whose references
    import PyTorch: a grading worker never needs PyTorch itself (its kernels and checks run in the
    fork servers). The test suite checks that both give the same names.
    """
    from grader.classroom import lessons

    return frozenset(name for lesson in lessons.all_lessons() for name in lesson.graded_names)


class _Visitor(ast.NodeVisitor):
    def __init__(self, graded: frozenset[str] = frozenset()) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module path
        self.signs: list[str] = []
        self.graded = graded

    def _add(self, sign: str) -> None:
        if sign not in self.signs:
            self.signs.append(sign)

    # imports: remember what each local name stands for
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.startswith(EXPLORERS + "."):
                self._add(_internals_sign(a.name))
            if a.asname:
                self.aliases[a.asname] = a.name
                if a.asname in self.graded and a.name.startswith(HELPERS):
                    self._add(_answer_sign(a.asname))
            else:
                root = a.name.split(".")[0]
                self.aliases[root] = root

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module:
            module = node.module
            for a in node.names:
                local = a.asname or a.name
                self.aliases[local] = f"{module}.{a.name}"
                if module.split(".")[0] != HELPERS:
                    continue
                if local in self.graded or a.name in self.graded:
                    self._add(_answer_sign(local))
                if module.startswith(EXPLORERS + "."):
                    self._add(_internals_sign(module))
                elif module == EXPLORERS and a.name not in explorer_entry_points():
                    self._add(_internals_sign(f"{module}.{a.name}"))

    def _uses_helpers(self, node: ast.AST) -> bool:
        """Whether code refers to the course's helpers beyond its data and visible checks."""
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)):
                dotted = self._dotted(sub)
                if dotted and dotted.split(".")[0] == HELPERS and not dotted.startswith(HELPERS_ALLOWED):
                    return True
        return False

    def _delegates(self, name: str, node: ast.AST) -> None:
        """A graded function bound to, or written around, the course's helper code."""
        if name in self.graded and self._uses_helpers(node):
            self._add(_answer_sign(name))

    def _dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.aliases.get(node.id) or ("builtins" if node.id == "__builtins__" else None)
        return None if base is None else ".".join([base, *reversed(parts)])

    def _protected(self, dotted: str | None) -> bool:
        return dotted is not None and dotted.split(".")[0] in PROTECTED

    def _target(self, t: ast.AST, verb: str = "patches") -> None:
        if isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                self._target(e, verb)
        elif isinstance(t, ast.Attribute):
            dotted = self._dotted(t)
            if self._protected(dotted):
                self._add(f"{verb} {dotted}")
            elif t.attr.startswith("__") and t.attr in ("__eq__", "__bool__", "__lt__", "__gt__", "__code__"):
                self._add(f"{verb} a comparison or code object ({t.attr})")
        elif isinstance(t, ast.Subscript):
            dotted = self._dotted(t.value)
            if dotted in ("sys.modules",):
                self._add("replaces a module in sys.modules")
            elif dotted and dotted.endswith("__dict__") and self._protected(dotted):
                self._add(f"{verb} {dotted[: -len('.__dict__')]}")
            elif isinstance(t.value, ast.Name) and t.value.id == "__builtins__":
                self._add("patches builtins")
            elif (
                isinstance(t.value, ast.Call)
                and isinstance(t.value.func, ast.Name)
                and t.value.func.id in ("vars", "globals")
            ):
                key = t.slice.value if isinstance(t.slice, ast.Constant) else None
                if (
                    t.value.func.id == "vars"
                    and t.value.args
                    and self._protected(self._dotted(t.value.args[0]))
                ):
                    self._add(f"{verb} {self._dotted(t.value.args[0])}")
                elif isinstance(key, str) and key in WATCHED_BUILTINS:
                    self._add(f"rebinds the built-in {key}")
        elif isinstance(t, ast.Name):
            if t.id in WATCHED_BUILTINS and hasattr(builtins, t.id):
                self._add(f"rebinds the built-in {t.id}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._target(t)
            if isinstance(t, ast.Name):
                self._delegates(t.id, node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._target(t, "deletes")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in WATCHED_BUILTINS:
            self._add(f"rebinds the built-in {node.name}")
        self._delegates(node.name, node)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name in WATCHED_BUILTINS:
            self._add(f"rebinds the built-in {node.name}")
        self.generic_visit(node)

    def _imported(self, node: ast.Call) -> None:
        """``__import__(name)`` or ``importlib.import_module(name)``: which module, and is it the explorers'?"""
        plain = (
            isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
            and "__import__" not in self.aliases
        )
        if not (plain or self._dotted(node.func) in IMPORTERS) or not node.args:
            return
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            self._add(COMPUTED_IMPORT)
            return
        module = first.value
        if module.startswith("."):  # import_module(".stages", "attention_course.explorers")
            package = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(package, ast.Constant) and isinstance(package.value, str)):
                self._add(COMPUTED_IMPORT)
                return
            try:
                module = importlib.util.resolve_name(module, package.value)
            except (ImportError, ValueError):
                return
        if module.startswith(EXPLORERS + "."):
            self._add(_internals_sign(module))
        elif module == EXPLORERS:
            fromlist = [k.value for k in node.keywords if k.arg == "fromlist"] + node.args[3:4]
            for names in fromlist:
                for name in names.elts if isinstance(names, (ast.List, ast.Tuple)) else []:
                    if isinstance(name, ast.Constant) and name.value not in explorer_entry_points():
                        self._add(_internals_sign(f"{module}.{name.value}"))

    def visit_Constant(self, node: ast.Constant) -> None:
        """A string that names a module of the explorers beyond their entry points."""
        if isinstance(node.value, str):
            for match in re.finditer(re.escape(EXPLORERS) + r"\.(\w+)", node.value):
                if match.group(1) not in explorer_entry_points():
                    self._add(_internals_sign(f"{EXPLORERS}.{match.group(1)}"))

    def visit_Call(self, node: ast.Call) -> None:
        self._imported(node)
        if isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args:
            dotted = self._dotted(node.args[0])
            if self._protected(dotted):
                name = (
                    node.args[1].value
                    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    else "?"
                )
                self._add(f"patches {dotted}.{name}")
        self.generic_visit(node)


def scan(sources: list[str], graded: frozenset[str] | None = None) -> list[str]:
    """Signs of tampering in these code cells (in order of first appearance, no repeats).

    ``graded``: the names of graded functions (default: every exercise of the course), for
    spotting one that is the course's helper code instead of the student's own.
    """
    from grader.classroom.sandbox import python_source

    visitor = _Visitor(graded_names() if graded is None else graded)
    for src in sources:
        with contextlib.suppress(SyntaxError):
            visitor.visit(ast.parse(python_source(src)))
    signs = list(visitor.signs)
    text = "\n".join(sources)
    for pattern, sign in TEXT_SIGNS:
        if pattern.search(text) and sign not in signs:
            signs.append(sign)
    return signs
