"""One rule of ``check-sources``: a lesson's example cells use its graded functions inside ``demo``.

An example or explorer cell that uses a student's function (calls it, or hands it to something that
calls it: ``is_implemented(mix, ...)``, ``stage_stepper(mix=mix)``) does so inside
``with demo(<function>, ...):``, or in a function decorated ``@demo(<function>, ...)``, naming each
graded function it runs. Then, in a student's session, one broken function prints a box that names
it and Run All goes on to the end of the notebook. A helper defined in an earlier cell that uses a
graded function outside ``demo`` counts as running it wherever it is used.
"""

from __future__ import annotations

import ast

Found = tuple[int, str, set[str], set[str] | None]


def demo_names(node: ast.AST) -> set[str] | None:
    """The functions a ``demo(...)`` call names ("*" for an argument it cannot read); None for any other node."""
    if not isinstance(node, ast.Call) or "demo" not in (
        getattr(node.func, "id", 0),
        getattr(node.func, "attr", 0),
    ):
        return None
    return {a.id if isinstance(a, ast.Name) else "*" for a in node.args}


class _Runs(ast.NodeVisitor):
    """Each use of a name that runs graded functions: (line, the name, they, the demo around it or None)."""

    def __init__(self, runs: dict[str, set[str]], demo: set[str] | None = None) -> None:
        self.runs = runs  # name -> the graded functions that calling it runs (a helper's, outside its demo)
        self.demo = demo
        self.found: list[Found] = []

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        named = [n for item in node.items if (n := demo_names(item.context_expr)) is not None]
        outer = self.demo
        for item in node.items:
            self.visit(item)
        self.demo = set().union(*named, outer or ()) if named else outer
        for statement in node.body:
            self.visit(statement)
        self.demo = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Its body runs when it is called: what it runs outside a demo of its own, its callers run."""
        for now in (*node.decorator_list, *node.args.defaults, *filter(None, node.args.kw_defaults)):
            self.visit(now)
        named = [n for d in node.decorator_list if (n := demo_names(d)) is not None]
        body = _Runs(self.runs, set().union(*named) if named else None)
        for statement in node.body:
            body.visit(statement)
        self.found += [f for f in body.found if f[3] is not None]
        self.runs[node.name] = {g for f in body.found if f[3] is None for g in f[2]}

    visit_AsyncWith, visit_AsyncFunctionDef = visit_With, visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        if demo_names(node) is None:  # the names demo(...) is given run nothing
            self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and self.runs.get(node.id):
            self.found.append((node.lineno, node.id, self.runs[node.id], self.demo))


def outside_demo(cells: list[tuple[str, ast.Module]], functions: list[str]) -> list[tuple[str, str]]:
    """(cell, what is wrong) for each use of a graded function outside a ``demo`` naming it, cells in order."""
    runs: dict[str, set[str]] = {name: {name} for name in functions}
    problems = []
    for cell, tree in cells:
        visitor = _Runs(runs)
        visitor.visit(tree)
        for line, name, ran, demo in visitor.found:
            them = [f for f in functions if f in ran]
            what = f"line {line} uses {name}" + ("" if them == [name] else f" (which runs {', '.join(them)})")
            if demo is None:
                problems.append(
                    (
                        cell,
                        f"{what} outside demo: put it inside `with demo({', '.join(them)}):` (or decorate its "
                        "function with `@demo(...)`), so that in a student's session a broken function is "
                        "named in a box and Run All goes on",
                    )
                )
            elif "*" not in demo and not ran <= demo:
                missing = ", ".join(f for f in them if f not in demo)
                problems.append(
                    (
                        cell,
                        f"{what} inside a demo(...) that does not name {missing}: add it, so that the box "
                        "names the function that failed",
                    )
                )
    return problems
