"""The output check: what ``ast`` reads in the instrumented text, independently of how the lines were placed.

Before returning, ``instrument`` checks its own output three ways: it compiles; stripping it gives back the input;
and, here, with ``ast`` alone (so a fault in how lines were counted or placed cannot hide), that once the added
statements are taken out the module is the input's, that each ``begin`` is followed by the statement holding its
phase call and then its ``end``, each ``accepted`` follows the statement binding its name, and the decorator sits on
each entry method. Standard library only.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Sequence

from eaglepatch.transform.marks import ALIAS, RUNTIME_MODULE
from eaglepatch.transform.results import WorkerInfo


def _our_call(stmt: ast.stmt) -> tuple[str, list[object]] | None:
    """``("begin", ["draft", "decode"])`` for a statement ``_eaglepatch.begin("draft", "decode")``, and so on for
    end and accepted (an argument that is a name gives its name); None for any other statement."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    func = stmt.value.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == ALIAS
            and func.attr in ("begin", "end", "accepted")):
        return None
    args: list[object] = []
    for a in stmt.value.args:
        args.append(a.id if isinstance(a, ast.Name) else a.value if isinstance(a, ast.Constant) else a)
    return func.attr, args


def _is_entry_decorator(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "entry" and isinstance(node.value, ast.Name)
            and node.value.id == ALIAS)


def _is_our_import(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.ImportFrom) and stmt.level == 1 and stmt.module is None and len(stmt.names) == 1
            and stmt.names[0].name == RUNTIME_MODULE and stmt.names[0].asname == ALIAS)


def _binds(stmt: ast.stmt, name: object) -> bool:
    """``stmt`` is an assignment that binds ``name`` (anywhere in its targets: tuples, lists, starred)."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    else:
        return False
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name
               for t in targets for n in ast.walk(t))


def _statements(tree: ast.Module) -> tuple[list[list[ast.stmt]], list[ast.stmt]]:
    """Every list of statements in ``tree`` (bodies, else and finally blocks, handlers' and cases' bodies), and
    every statement, in source order. Only statements are walked: no expression holds a statement."""
    bodies: list[list[ast.stmt]] = []
    stmts: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        bodies.append(body)
        for stmt in body:
            stmts.append(stmt)
            for name in ("body", "orelse", "finalbody"):  # lists of statements (maybe empty) on statements
                visit(getattr(stmt, name, None) or [])
            for part in getattr(stmt, "handlers", []) + getattr(stmt, "cases", []):
                visit(part.body)

    visit(tree.body)
    return bodies, stmts


def check_output(original: ast.Module, new: str | ast.Module,
                 workers: Sequence[WorkerInfo]) -> tuple[str, str | None, int | None] | None:
    """None when ``new`` is ``original`` (the input's ast) instrumented as ``workers`` say, else (what is wrong,
    class, 1-based line of ``new``). ``new`` is the instrumented text, or its ast (which the check then changes).

    Read with ``ast`` alone, so a fault in how lines were counted or placed cannot hide: once the added
    statements, decorators and import are taken out, the module is the input's, node for node; each
    ``begin(phase, mode)`` is directly followed by the statement (the statements of its lines) holding a call of
    that phase found in the input, then (unless it is a ``return``) by ``end(phase)``; each ``end`` closes such a
    ``begin``; each ``accepted(name, ...)`` follows the statement that binds ``name``; the entry decorator is the
    first decorator of each supported class's entry method and of nothing else; the import comes once, at the top
    level, before the first decorator."""
    if isinstance(new, ast.Module):
        tree = new
    else:
        try:
            tree = ast.parse(new)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            return f"the instrumented file does not parse ({exc})", None, None
    supported = [w for w in workers if w.status == "supported"]
    want_sites = Counter((p.phase, p.mode, p.call) for w in supported for p in w.phases)
    by_phase: dict[tuple[str, str], set[str]] = {}
    for (phase, mode, call) in want_sites:
        by_phase.setdefault((phase, mode), set()).add(call)
    got_sites: Counter[tuple[str, str, str]] = Counter()
    closed: set[int] = set()  # id() of the end statements a begin accounted for
    n_accepted = 0
    bodies, stmts = _statements(tree)
    for body in bodies:
        for i, stmt in enumerate(body):
            ours = _our_call(stmt)
            if ours is None:
                continue
            kind, args = ours
            if kind == "begin":
                if len(args) != 2 or (args[0], args[1]) not in by_phase:
                    return f"a begin{tuple(args)} for no phase found", None, stmt.lineno
                group = []  # the statements of the phase's lines: one, or several joined by ';'
                for nxt in body[i + 1:]:
                    if group and nxt.lineno != group[-1].end_lineno:
                        break
                    group.append(nxt)
                calls = {ast.unparse(c.func) for g in group for c in ast.walk(g) if isinstance(c, ast.Call)}
                hit = calls & by_phase[(args[0], args[1])]
                if len(hit) != 1:
                    return f"begin({args[0]!r}) is not followed by the statement holding its phase call", None, \
                        stmt.lineno
                got_sites[(args[0], args[1], hit.pop())] += 1
                if len(group) == 1 and isinstance(group[0], ast.Return):
                    continue
                after = i + 1 + len(group)
                end = _our_call(body[after]) if after < len(body) else None
                if end is None or end[0] != "end" or end[1] != [args[0]]:
                    return f"the phase statement after begin({args[0]!r}) is not followed by its end", None, \
                        group[-1].end_lineno
                closed.add(id(body[after]))
            elif kind == "end":
                if id(stmt) not in closed:
                    # A begin of the same body accounted for it earlier in this loop, or none did: body order is
                    # source order, so an end is always seen after its begin.
                    return f"an end{tuple(args)} that closes no begin", None, stmt.lineno
            else:
                n_accepted += 1
                # The statements of the last line before it (several when joined by ';'), ours left out.
                before = [s for s in body[:i] if _our_call(s) is None]
                line = [s for s in before if s.end_lineno >= before[-1].lineno] if before else []
                if not args or not any(_binds(s, args[0]) for s in line):
                    return f"accepted({args[0] if args else ''}) does not follow the statement binding it", None, \
                        stmt.lineno
    if got_sites != want_sites:
        return "the begin lines do not match the phase calls found", None, None
    want_ends = sum(1 for w in supported for p in w.phases if p.form == "statement")
    if len(closed) != want_ends:
        return "the end lines do not match the phase statements found", None, None
    if n_accepted != sum(len(w.facts) for w in supported):
        return "the accepted lines do not match the facts found", None, None
    # The entry decorators: first on each supported class's entry method (the definition the class keeps).
    entries = {w.cls: w.method for w in supported}
    decorated: list[tuple[str, str]] = []
    first_decorator = None
    n_decorators = 0
    for node in stmts:
        for k, d in enumerate(getattr(node, "decorator_list", ())):
            if _is_entry_decorator(d):
                n_decorators += 1
                if k != 0 or isinstance(node, ast.ClassDef):
                    return "the entry decorator is not the first decorator of a method", None, d.lineno
                first_decorator = min(d.lineno, first_decorator or d.lineno)
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        defs = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for n in defs.values():
            if n.decorator_list and _is_entry_decorator(n.decorator_list[0]):
                if entries.get(cls.name) != n.name:
                    return f"the entry decorator sits on {cls.name}.{n.name}, not an entry method", cls.name, \
                        n.decorator_list[0].lineno
                decorated.append((cls.name, n.name))
    if sorted(decorated) != sorted(entries.items()) or n_decorators != len(entries):
        missing = sorted(set(entries.items()) - set(decorated)) or sorted(entries.items())
        return f"the entry decorator is not on {missing[0][0]}.{missing[0][1]} alone", missing[0][0], None
    imports = [n for n in tree.body if _is_our_import(n)]
    if len(imports) != 1 or (first_decorator is not None and imports[0].lineno > first_decorator):
        return "the runtime import is not once at the top level before the first decorator", None, None
    # Take out what was added; the rest must be the input, node for node.
    tree.body.remove(imports[0])
    for body in bodies:
        body[:] = [s for s in body if _our_call(s) is None]
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.decorator_list and \
                _is_entry_decorator(node.decorator_list[0]):
            node.decorator_list.pop(0)
    if not _same_tree(tree, original):
        return "once the added lines are taken out, the module is not the input's", None, None
    return None


def _same_tree(a: ast.AST, b: ast.AST) -> bool:
    """``ast.dump(a) == ast.dump(b)`` (fields only, no positions), without building the strings. Iterative (no
    recursion limit on deep expressions); a node's fields are read from its ``__dict__``, where ast keeps them."""
    stack: list[tuple[object, object]] = [(a, b)]
    pop, push = stack.pop, stack.append
    fields: dict[type, tuple[str, ...] | None] = {}  # a type's fields; None: not a node
    while stack:
        x, y = pop()
        t = type(x)
        if t is not type(y):
            return False
        if t in fields:
            fs = fields[t]
        else:
            fs = fields[t] = t._fields if issubclass(t, ast.AST) else None
        if fs is not None:
            dx, dy = x.__dict__, y.__dict__
            for f in fs:
                push((dx.get(f), dy.get(f)))
        elif t is list:
            if len(x) != len(y):  # type: ignore[arg-type]
                return False
            stack.extend(zip(x, y))  # type: ignore[call-overload]
        elif x != y:
            return False
    return True
