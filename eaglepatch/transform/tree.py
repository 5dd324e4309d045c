"""Reading a method's libcst tree: where each call of a statement sits, and the statements of a method.

``call_positions`` walks one statement whole (lambdas, comprehensions and nested definitions included) and says, for
each call, why it may not run exactly once when the statement runs (None: it does), which is how the finder tells a
phase call it can bracket from one it must refuse. ``walk_statements`` lists a suite's statements in source order,
marking those around which no line can be added (a compound statement's header, a one-line suite).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from eaglepatch.transform.recipe import PhaseCall


# Fields of a node that hold no call: brackets, whitespace, commas, operators, names after ``as``/``=``.
_NO_CALLS = frozenset({"lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "leading_lines", "comma",
                       "semicolon", "equal", "dot", "first_colon", "second_colon", "star", "operator", "asname",
                       "keyword", "start", "end", "conversion", "asynchronous"})
_FIELDS: dict[type, tuple[str, ...]] = {}
_SOURCE_ORDER: dict[type, tuple[str, ...]] = {
    cst.IfExp: ("body", "test", "orelse"),  # "body if test else orelse": declared test first
    cst.FunctionDef: ("decorators", "name", "type_parameters", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.Parameters: ("posonly_params", "posonly_ind", "params", "star_arg", "kwonly_params", "star_kwarg"),
}


def _fields(t: type) -> tuple[str, ...]:
    """The fields of a node type that may hold a call, in the order of the source (a CSTVisitor's order): a walk
    over them (``call_positions``) finds what a CSTVisitor finds, in its order, at a tenth of its cost."""
    names = _FIELDS.get(t)
    if names is None:
        if t in _SOURCE_ORDER:  # fields declared in another order than the source's
            names = tuple(n for n in _SOURCE_ORDER[t] if n in {f.name for f in dataclasses.fields(t)})
        else:
            names = tuple(f.name for f in dataclasses.fields(t) if f.name not in _NO_CALLS and "whitespace" not in f.name)
        _FIELDS[t] = names
    return names


def callee_of(call: cst.Call) -> str:
    """The callee of a phase call as a dotted name (``self.draft``): a phase call's callee always has one."""
    name = get_full_name_for_node(call.func)
    assert name is not None
    return name


def phase_callees(pc: PhaseCall) -> str:
    """``self.draft(...)``, or ``self.draft(...) or self.forward_draft_decode(...)``."""
    return " or ".join(f"{c}(...)" for c in pc.calls)


def _kwarg_names(call: cst.Call) -> set[str]:
    return {a.keyword.value for a in call.args if a.keyword is not None}


def matches(call: cst.Call, pc: PhaseCall, callee: str | None) -> bool:
    """``call`` (whose callee's dotted name is ``callee``) is one of ``pc``'s calls, with its keywords."""
    if callee not in pc.calls:
        return False
    kws = _kwarg_names(call)
    return all(k in kws for k in pc.with_kwargs) and not any(k in kws for k in pc.without_kwargs)


# Why a position inside a statement is not one where a call runs exactly once, right when its statement runs.
_MAYBE = "in a conditional expression (a if c else b): it may not run"
_SHORT = "on the right of 'and'/'or': it may not run"
_CHAIN = "in a chained comparison after its first comparison: it may not run"
_LAMBDA = "inside a lambda: it runs when the lambda is called, if ever, not where the lambda is written"
_COMP = "inside a comprehension or generator expression: it runs once per item, or later (lazily)"
_NESTED = "inside a function or class defined in the method: it runs when that is called, not here"
_DEFAULT = "in a default argument"
_ANNOTATION = "in an annotation (never evaluated inside a function)"
_FSTRING = "inside an f-string: not a place eaglepatch brackets (in doubt, it refuses)"
REFERENCE = "named without being called here (stored or passed on): when it runs is not known"
_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)


@dataclasses.dataclass
class CallPositions:
    """The calls of a statement with why each may not run exactly once with it (None: it does), the bare
    references to a callee the recipe names (not called here), and whether the statement yields or awaits."""

    calls: list[tuple[cst.Call, str | None]]
    refs: list[tuple[cst.CSTNode, str]]
    pauses: bool


# The reason a whole node gives everything inside it, and the reason one field of a node gives what is in it.
_INSIDE: dict[type, str] = {cst.Lambda: _LAMBDA, cst.GeneratorExp: _COMP, cst.ListComp: _COMP, cst.SetComp: _COMP,
                            cst.DictComp: _COMP, cst.FormattedString: _FSTRING, cst.Annotation: _ANNOTATION,
                            cst.ClassDef: _NESTED}
_IN_FIELD: dict[tuple[type, str], str | None] = {
    (cst.IfExp, "body"): _MAYBE, (cst.IfExp, "orelse"): _MAYBE, (cst.BooleanOperation, "right"): _SHORT,
    (cst.Param, "default"): _DEFAULT, (cst.FunctionDef, "body"): _NESTED, (cst.FunctionDef, "decorators"): _NESTED,
}


def call_positions(node: cst.CSTNode, callees: frozenset[str], lasts: frozenset[str]) -> CallPositions:
    """Walk ``node`` whole (lambdas, comprehensions and nested definitions included), in source order.

    ``callees``: the dotted names the recipe calls phases; ``lasts``: their last parts, so that a dotted name is
    only built for a Name or Attribute that could be one of them. (Types are compared exactly, not with
    isinstance: libcst's node classes are concrete, and isinstance on them is an ABC check, ten times slower.)"""
    out = CallPositions([], [], False)
    Call, Name, Attribute, Comparison, Lambda = cst.Call, cst.Name, cst.Attribute, cst.Comparison, cst.Lambda

    def walk(n: cst.CSTNode, why: str | None, called: bool) -> None:
        t = type(n)
        if t is Call:
            out.calls.append((n, why))  # type: ignore[arg-type]
        elif t is cst.Yield or t is cst.Await:
            out.pauses = True
        elif not called and (t is Name or t is Attribute):
            last = n.value if t is Name else n.attr.value  # type: ignore[attr-defined]
            if last in lasts and get_full_name_for_node(n) in callees:
                out.refs.append((n, why or REFERENCE))
        elif t is Comparison:
            walk(n.left, why, False)  # type: ignore[attr-defined]
            for i, target in enumerate(n.comparisons):  # type: ignore[attr-defined]
                walk(target.comparator, why or (_CHAIN if i else None), False)
            return
        inner = why or _INSIDE.get(t)
        for name in _fields(t):
            reason = inner or _IN_FIELD.get((t, name))
            if t is Lambda and name == "params":
                reason = why  # a lambda's defaults run where it is written: Param says "default argument"
            v = getattr(n, name)
            if isinstance(v, cst.CSTNode):  # a call's callee, and the name after a dot, are no bare reference
                walk(v, reason, (t is Call and name == "func") or (t is Attribute and name == "attr"))
            elif isinstance(v, (tuple, list)):
                for x in v:
                    if isinstance(x, cst.CSTNode):
                        walk(x, reason, False)

    walk(node, None, False)
    return out


def _parts(stmt: cst.BaseCompoundStatement) -> Iterator[tuple[bool, cst.CSTNode]]:
    """A compound statement's pieces in source order: ``(True, expr)`` for an expression of a header line (where no
    line can be inserted), ``(False, suite)`` for a suite.

    ``if``: its test, its body, then each ``elif``'s test and body, then the ``else``; loops and ``with``: the
    header, the body, the ``else``; ``try``: the body, each handler's type and body, ``else``, ``finally``;
    ``match``: the subject, then each case's guard and body. (Nested functions and classes never come here.)
    """
    if isinstance(stmt, cst.If):
        node: cst.If | cst.Else | None = stmt
        while isinstance(node, cst.If):  # the if, then its elif chain (an elif is an If in orelse)
            yield True, node.test
            yield False, node.body
            node = node.orelse
        if node is not None:
            yield False, node.body
        return
    if isinstance(stmt, cst.Match):
        yield True, stmt.subject
        for case in stmt.cases:
            if case.guard is not None:
                yield True, case.guard
            yield False, case.body
        return
    if isinstance(stmt, cst.While):
        yield True, stmt.test
    elif isinstance(stmt, cst.For):
        yield True, stmt.target
        yield True, stmt.iter
    elif isinstance(stmt, cst.With):
        for item in stmt.items:
            yield True, item
    yield False, stmt.body
    for h in getattr(stmt, "handlers", ()):
        if h.type is not None:
            yield True, h.type
        yield False, h.body
    orelse = getattr(stmt, "orelse", None)
    if orelse is not None:
        yield False, orelse.body
    final = getattr(stmt, "finalbody", None)
    if final is not None:
        yield False, final.body


@dataclasses.dataclass
class _Stmt:
    node: cst.CSTNode  # SimpleStatementLine, a compound statement's header expression, or a nested definition
    nowhere: str | None = None  # where no line can be added around it: a header, or a one-line suite


def walk_statements(suite: cst.BaseSuite) -> Iterator[_Stmt]:
    """Statements of a suite in source order, recursing into compound statements."""
    if isinstance(suite, cst.SimpleStatementSuite):
        yield _Stmt(suite, "a one-line compound statement")
        return
    for stmt in suite.body:
        if isinstance(stmt, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)):
            # A nested definition: nothing in it runs here; a phase call or callee in it is refused
            # (call_positions says why), and no call in it is one a fact is read after.
            yield _Stmt(stmt)
        else:
            for is_header, part in _parts(stmt):
                if is_header:
                    yield _Stmt(part, "a compound statement's header")
                else:
                    yield from walk_statements(part)


def bound_names(stmt: cst.CSTNode) -> list[str]:
    """Names a simple statement binds: assignment targets, including inside tuples."""
    names: list[str] = []

    def collect(t: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name):
            names.append(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:  # Element or StarredElement: ``value`` is the target either way
                collect(el.value)

    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for t in small.targets:
                    collect(t.target)
            elif isinstance(small, cst.AnnAssign):
                collect(small.target)
    return names


def single_target(stmt: cst.CSTNode) -> str | None:
    """The one Name a statement assigns to (``x = ...`` / ``x: T = ...``), else None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
        return small.target.value
    return None
