"""Signs of tampering in a student's code, found by reading it (never by running it).

These only flag a submission for review: scores never depend on them (the
verdicts are re-decided outside the kernel). Each sign is one readable
sentence, e.g. "patches torch.isclose" or "mentions the grading package".
"""

from __future__ import annotations

import ast
import builtins
import re

# modules whose attributes a submission has no business replacing
PROTECTED = {
    "numpy",
    "torch",
    "math",
    "cmath",
    "builtins",
    "operator",
    "grader",
    "attention_course",
    "unittest",
    "numbers",
    "IPython",
    "nbgrader",
    "functools",
    "warnings",
    "traceback",
}
# built-in names whose rebinding looks like an attempt to fool a check
WATCHED_BUILTINS = {
    "isinstance",
    "issubclass",
    "AssertionError",
    "BaseException",
    "Exception",
    "bool",
    "callable",
    "type",
    "hasattr",
    "getattr",
    "setattr",
    "__import__",
    "__builtins__",
    "compile",
    "exec",
    "eval",
    "float",
    "abs",
    "all",
    "any",
}
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
    (re.compile(r"\b(meta_path|path_hooks|__import__)\b"), "changes the import system"),
    (
        re.compile(r"sys\.modules\s*(\[[^\]]*\]\s*=|\.(update|pop|setdefault|__setitem__))"),
        "replaces a module in sys.modules",
    ),
    (re.compile(r"\bdel\s+sys\.modules\b"), "replaces a module in sys.modules"),
]


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # local name -> dotted module path
        self.signs: list[str] = []

    def _add(self, sign: str) -> None:
        if sign not in self.signs:
            self.signs.append(sign)

    # imports: remember what each local name stands for
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                root = a.name.split(".")[0]
                self.aliases[root] = root

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module:
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def _dotted(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("vars", "globals")
        ):
            return None
        if not isinstance(node, ast.Name):
            return None
        base = self.aliases.get(node.id)
        if base is None:
            if node.id == "__builtins__":
                base = "builtins"
            else:
                return None
        return ".".join([base, *reversed(parts)])

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
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # noqa: N815

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name in WATCHED_BUILTINS:
            self._add(f"rebinds the built-in {node.name}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
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


def scan(sources: list[str]) -> list[str]:
    """Signs of tampering in these code cells (in order of first appearance, no repeats)."""
    from grader.classroom.sandbox import python_source

    visitor = _Visitor()
    for src in sources:
        try:
            visitor.visit(ast.parse(python_source(src)))
        except SyntaxError:
            pass
    signs = list(visitor.signs)
    text = "\n".join(sources)
    for pattern, sign in TEXT_SIGNS:
        if pattern.search(text) and sign not in signs:
            signs.append(sign)
    return signs
