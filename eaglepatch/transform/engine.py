"""The pure core: a worker module's source text in, a result value out. No files, no SSH, no printing.

``instrument(source, path, recipe)`` finds each recipe class's entry method and phase calls by their shape (libcst)
and returns ``Instrumented`` (new text plus what it found), ``NotApplicable`` (no class of the recipe in this file)
or ``Refused`` (the reason, with file, class and line). ``strip(source)`` removes what ``instrument`` added.

What the patch adds is only whole lines, each ending with ``MARKER``: the runtime import, a decorator on the entry
method, ``begin``/``end`` lines around each phase statement and an ``accepted`` line after the verify statement.
So removing the marked lines gives back the original bytes, and ``git diff`` of a patched file shows only ``+``.
Lines are counted as Python counts them (``marks.split_lines``), never with ``str.splitlines``.

A phase call is timed only where its statement's lines bracket exactly that call: a call that may not run when its
statement runs (``a if c else b``, ``a or b``, a chained comparison), that runs later or elsewhere (a lambda, a
comprehension, a nested function, a default argument, a bare reference), or whose end line could not run (``; break``
on its line, a ``return`` in a helper method) is refused, never bracketed.

Before returning, ``instrument`` checks its own output three ways: it compiles; stripping it gives back the input;
and, independently of how the lines were found, ``ast`` says that once the added statements are taken out the
module is the input's, that each ``begin`` is followed by the statement holding its phase call and then its
``end``, each ``accepted`` follows the statement binding its name, and the decorator sits on each entry method.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import tokenize
from collections import Counter
from typing import Iterator, Sequence, Union

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from eaglepatch.transform.marks import (
    ALIAS,
    BOM,
    IMPORT_CODE,
    MARKED_LINE,
    MARKER,
    OUR_LINE,
    RUNTIME_MODULE,
    is_instrumented,
    split_lines,
    strip_lines,
)
from eaglepatch.transform.recipe import Fact, Family, PhaseCall, Recipe

__all__ = ["MARKER", "RUNTIME_MODULE", "Instrumented", "NotApplicable", "Refused", "TransformResult", "WorkerInfo",
           "analyze", "instrument", "is_instrumented", "split_lines", "strip", "strip_lines"]

# The position libcst writes into a ParserSyntaxError's message.
_ERROR_AT = re.compile(r"error at (\d+):(\d+)")


@dataclasses.dataclass(frozen=True)
class PhaseSite:
    """A phase call found in the source: 1-based lines of the statement holding it (original file)."""

    phase: str
    mode: str
    method: str
    call: str
    line: int
    end_line: int
    form: str  # "statement" (begin before, end after) or "return" (begin before; closed at cycle end)


@dataclasses.dataclass(frozen=True)
class FactSite:
    """A per-cycle fact read after a statement: ``expr`` is the local name read, at 1-based ``line``."""

    name: str
    method: str
    expr: str
    attrs: tuple[str, ...]
    bonus_per_req: int
    line: int


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker class of the file and what the transform makes of it.

    ``status`` is ``supported`` (entry method and phases found), ``inherits`` (no entry method of its own: the
    base class's instrumented method times it), or ``unsupported`` (with ``reason``). ``timer`` is the family's
    timer (``sync`` or ``events``: what ``--mode auto`` gives it), None when unsupported. ``missing`` lists the
    optional phases of the recipe found nowhere in the class (``"prefill target"``): its records carry none.
    """

    cls: str
    family: str | None
    status: str
    method: str | None = None
    method_start: int | None = None
    method_end: int | None = None
    phases: tuple[PhaseSite, ...] = ()
    facts: tuple[FactSite, ...] = ()
    reason: str | None = None
    timer: str | None = None
    missing: tuple[str, ...] = ()

    @property
    def phase_names(self) -> list[str]:
        """Distinct phase names in source order."""
        seen: list[str] = []
        for p in self.phases:
            if p.phase not in seen:
                seen.append(p.phase)
        return seen


@dataclasses.dataclass(frozen=True)
class Instrumented:
    """Success: ``source`` is the instrumented text; ``changed`` is False when the input already was exactly it."""

    path: str
    source: str
    workers: tuple[WorkerInfo, ...]
    warnings: tuple[str, ...]
    changed: bool
    was_patched: bool


@dataclasses.dataclass(frozen=True)
class NotApplicable:
    """The file holds no class the recipe instruments (it may list unsupported ones)."""

    path: str
    reason: str
    workers: tuple[WorkerInfo, ...] = ()


@dataclasses.dataclass(frozen=True)
class Refused:
    """The transform will not guess: ``message()`` is one line naming file, class and line."""

    path: str
    reason: str
    cls: str | None = None
    line: int | None = None

    def message(self) -> str:
        where = self.path + (f":{self.line}" if self.line else "")
        who = f" ({self.cls})" if self.cls else ""
        return f"{where}{who}: {self.reason}"


TransformResult = Union[Instrumented, NotApplicable, Refused]


class _Refusal(Exception):
    def __init__(self, reason: str, cls: str | None = None, line: int | None = None):
        self.reason, self.cls, self.line = reason, cls, line


# ----------------------------------------------------------------------------------------------------------------
# Reading the tree


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
    over them (``_positions``) finds what a CSTVisitor finds, in its order, at a tenth of its cost."""
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


def _callees(pc: PhaseCall) -> str:
    """``self.draft(...)``, or ``self.draft(...) or self.forward_draft_decode(...)``."""
    return " or ".join(f"{c}(...)" for c in pc.calls)


def _kwarg_names(call: cst.Call) -> set[str]:
    return {a.keyword.value for a in call.args if a.keyword is not None}


def _matches(call: cst.Call, pc: PhaseCall, callee: str | None) -> bool:
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
_REFERENCE = "named without being called here (stored or passed on): when it runs is not known"
_COMPREHENSIONS = (cst.GeneratorExp, cst.ListComp, cst.SetComp, cst.DictComp)


@dataclasses.dataclass
class _Positions:
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


def _positions(node: cst.CSTNode, callees: frozenset[str], lasts: frozenset[str]) -> _Positions:
    """Walk ``node`` whole (lambdas, comprehensions and nested definitions included), in source order.

    ``callees``: the dotted names the recipe calls phases; ``lasts``: their last parts, so that a dotted name is
    only built for a Name or Attribute that could be one of them. (Types are compared exactly, not with
    isinstance: libcst's node classes are concrete, and isinstance on them is an ABC check, ten times slower.)"""
    out = _Positions([], [], False)
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
                out.refs.append((n, why or _REFERENCE))
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


def _walk(suite: cst.BaseSuite) -> Iterator[_Stmt]:
    """Statements of a suite in source order, recursing into compound statements."""
    if isinstance(suite, cst.SimpleStatementSuite):
        yield _Stmt(suite, "a one-line compound statement")
        return
    for stmt in suite.body:
        if isinstance(stmt, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)):
            # A nested definition: nothing in it runs here; a phase call or callee in it is refused
            # (_positions says why), and no call in it is one a fact is read after.
            yield _Stmt(stmt)
        else:
            for is_header, part in _parts(stmt):
                if is_header:
                    yield _Stmt(part, "a compound statement's header")
                else:
                    yield from _walk(part)


def _bound_names(stmt: cst.CSTNode) -> list[str]:
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


def _single_target(stmt: cst.CSTNode) -> str | None:
    """The one Name a statement assigns to (``x = ...`` / ``x: T = ...``), else None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name):
        return small.targets[0].target.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value is not None:
        return small.target.value
    return None


# ----------------------------------------------------------------------------------------------------------------
# Finding what to instrument


@dataclasses.dataclass
class _Insert:
    """A line to add after ``after_line`` (0-based; -1: at the very top). Lines added at one position keep the
    order they were found in: a phase's end, the fact read after it, the next phase's begin."""

    after_line: int
    anchor_line: int  # 0-based line whose line ending (and indentation, if ``indented``) the new line copies
    code: str
    indented: bool  # the runtime import is not: it goes at the top level whatever its anchor


class _Finder:
    def __init__(self, source: str, path: str, recipe: Recipe):
        self.source, self.path, self.recipe = source, path, recipe
        self.lines = split_lines(source)
        # The standard ast first (fast): line numbers of classes, methods and imports, and the triage of classes.
        # libcst never parses the whole file: only the methods it scans in a class of the recipe (the entry method
        # and the family's helpers), each alone, with positions from its PositionProvider shifted by the method's
        # line in the file: _parse_method.
        try:
            self.tree = ast.parse(source)
        except SyntaxError as exc:
            raise _Refusal(f"does not parse ({exc.msg})", line=exc.lineno) from None
        except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte before 3.12 is a ValueError
            raise _Refusal(f"does not parse with this Python ({exc})") from None
        self.ast_classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        self.pos: dict[cst.CSTNode, CodeRange] = {}
        self.warnings: list[str] = []
        self.inserts: list[_Insert] = []

    def _parse_method(self, cls: ast.ClassDef, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> cst.FunctionDef:
        """The libcst tree of one method, its positions (``self.pos``) in file coordinates.

        libcst parses the method's own lines only, inside a class: the file's class header when the method is the
        first statement of the class, else a stand-in header followed by the lines after the previous statement
        (blank lines and comments). Every line of the method is the file's, so columns are the file's and lines
        differ by one shift, taken at the ``def`` line, where both ast's ``lineno`` and libcst's FunctionDef range
        start (below decorators). A method libcst cannot parse is refused, with the file's line.
        """
        at = cls.body.index(fn)
        if at == 0:
            head, first = "", cls.lineno - 1  # from the class line itself: nothing but comments lies between
        else:
            head, first = "class _eaglepatch_holder:\n", cls.body[at - 1].end_lineno
        text = head + "".join(self.lines[first : fn.end_lineno])  # libcst needs no final newline
        offset = first - (1 if head else 0)  # file line = line in ``text`` + offset
        try:
            module = cst.parse_module(text)
        except cst.ParserSyntaxError as exc:
            # libcst writes the position into its message ("error at 12:4: ..."); it becomes the refusal's line
            # (a line of the file), so no line of the text parsed stays in the message.
            line, message = exc.raw_line, exc.message
            at_ = _ERROR_AT.search(message)
            if at_:
                line, message = int(at_[1]), message[: at_.start()] + f"error at column {at_[2]}" + message[at_.end():]
            raise _Refusal(f"does not parse: {message}", line=line + offset) from None
        except RecursionError:
            raise _Refusal("does not parse: nested too deeply", line=fn.lineno) from None
        # The text holds the holder class with the method alone in it (comments and blank lines before it).
        node = module.body[0].body.body[-1]  # type: ignore[attr-defined]
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        shift = fn.lineno - positions[node].start.line
        for n, r in positions.items():
            self.pos[n] = CodeRange((r.start.line + shift, r.start.column), (r.end.line + shift, r.end.column))
        return node

    def _range(self, node: cst.CSTNode) -> CodeRange:
        return self.pos[node]

    def _ast_method(self, cls: str, method: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        return self._methods(self.ast_classes[cls])[method]

    def _def_line(self, cls: str, method: str) -> int:
        node = self._ast_method(cls, method)
        return node.decorator_list[0].lineno if node.decorator_list else node.lineno

    def run(self) -> list[WorkerInfo]:
        workers: list[WorkerInfo] = []
        for node in self.tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            if self.recipe.family_of(node.name) is None:
                info = self._other_class(node)
            else:
                info = self._class(node)
            if info is not None:
                workers.append(info)
        return workers

    def _other_class(self, node: ast.ClassDef) -> WorkerInfo | None:
        """A class no family names: unsupported (known, or with an entry method), inheriting, or not a worker."""
        name = node.name
        methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        reason = self.recipe.unsupported_reason(name)
        entry_here = sorted(m for m in self.recipe.entry_names if m in methods)
        if reason is None and not entry_here:
            # A subclass of an instrumented worker (StandaloneWorker) is timed through its base's method.
            bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                     if isinstance(b, (ast.Name, ast.Attribute))]
            base_fam = next((self.recipe.family_of(b) for b in bases if self.recipe.family_of(b)), None)
            if base_fam is None:
                return None  # not a worker: not ours to mention
            return WorkerInfo(cls=name, family=base_fam.name, status="inherits",
                              reason="inherits its entry method: timed through the base class", timer=base_fam.timer)
        line = self._def_line(name, entry_here[0]) if entry_here else node.lineno
        return WorkerInfo(
            cls=name,
            family=None,
            status="unsupported",
            method=entry_here[0] if entry_here else None,
            method_start=line,
            reason=reason or "no recipe for this class (add one with --recipe)",
        )

    def _methods(self, cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for n in cls.body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[n.name] = n  # the last definition of a name is the one the class keeps
        return out

    def _class(self, cls: ast.ClassDef) -> WorkerInfo | None:
        name = cls.name
        methods = self._methods(cls)
        fam = self.recipe.family_of(name)
        assert fam is not None  # run() sends other classes to _other_class
        entries = [m for m in fam.entry if m in methods]
        if not entries:
            return WorkerInfo(cls=name, family=fam.name, status="inherits", reason="no entry method of its own",
                              timer=fam.timer)
        if len(entries) > 1:
            raise _Refusal(f"both {entries[0]} and {entries[1]} are defined: which is the entry?", name,
                           self._def_line(name, entries[1]))
        # libcst parses only the methods it scans (the entry method and the family's helpers), not the file.
        helpers = [h for h in fam.helpers if h in methods and h != entries[0]]
        scanned = [self._parse_method(cls, methods[m]) for m in [entries[0]] + helpers]
        entry = scanned[0]
        rng = self._range(entry)
        if entry.asynchronous is not None:
            raise _Refusal(f"{entry.name.value} is async: not a shape eaglepatch knows", name, rng.start.line)
        phases: list[PhaseSite] = []
        facts: list[FactSite] = []
        found: set[int] = set()  # indexes of the family's phase entries found
        for fn in scanned:
            p, f, i = self._scan_method(name, fam, fn, entries[0])
            phases.extend(p)
            facts.extend(f)
            found |= i
        where = f"{entries[0]}" + (f" or {', '.join(helpers)}" if helpers else "")
        missing: list[str] = []
        for i, pc in enumerate(fam.phases):
            if i in found:
                continue
            if pc.required:
                raise _Refusal(f"phase {pc.name!r} ({_callees(pc)}) not found in {where}: unknown layout, "
                               "nothing instrumented", name, rng.start.line)
            what = f"{pc.mode} {pc.name}"
            if what not in missing and not any(p.phase == pc.name and p.mode == pc.mode for p in phases):
                missing.append(what)
                self.warnings.append(
                    f"{self.path}: {what}: not found in {name}.{where} of this release: {pc.mode} records carry no "
                    f"{pc.name} phase")
        if fam.facts and not facts:
            self.warnings.append(f"{self.path}: {name}: accepted tokens not found; records will carry accepted=null")
        for fa in fam.facts:
            if fa.required and not any(f.expr in fa.from_ or "$" in fa.from_ for f in facts):
                raise _Refusal("the accepted-tokens value the recipe requires is not found", name, rng.start.line)
        # The decorator goes above the def (or above its first decorator).
        first = self._range(entry.decorators[0]).start.line if entry.decorators else rng.start.line
        self.inserts.append(_Insert(first - 2, first - 1, f"@{ALIAS}.entry", indented=True))
        phases.sort(key=lambda p: p.line)
        return WorkerInfo(
            cls=name,
            family=fam.name,
            status="supported",
            method=entries[0],
            method_start=rng.start.line,
            method_end=rng.end.line,
            phases=tuple(phases),
            facts=tuple(facts),
            timer=fam.timer,
            missing=tuple(missing),
        )

    def _scan_method(self, cls: str, fam: Family, fn: cst.FunctionDef,
                     entry: str) -> tuple[list[PhaseSite], list[FactSite], set[int]]:
        """The phase sites and facts of one scanned method, and the indexes of the phase entries found.

        Every call of a statement is looked at wherever it sits (lambdas, comprehensions, nested definitions
        included); a phase call where the statement's lines would not bracket exactly one run of it is refused."""
        method = fn.name.value
        phases: list[PhaseSite] = []
        facts: list[FactSite] = []
        seen: dict[int, int] = {}  # index of PhaseCall -> line already found in this method
        callees = frozenset(c for pc in fam.phases for c in pc.calls)
        lasts = frozenset(c.rsplit(".", 1)[-1] for c in callees)
        for st in _walk(fn.body):
            pos = _positions(st.node, callees, lasts)
            hits = []
            for call, why in pos.calls:
                callee = get_full_name_for_node(call.func)
                if callee not in callees:
                    continue
                for i, pc in enumerate(fam.phases):
                    if _matches(call, pc, callee):
                        hits.append((i, pc, call, why))
            line = self._range(st.node).start.line
            for i, pc, call, why in hits:
                if why is not None:
                    raise _Refusal(f"phase call {callee_of(call)}(...) sits {why}", cls, self._range(call).start.line)
            if pos.refs:
                ref, why = pos.refs[0]
                name_ = get_full_name_for_node(ref)
                raise _Refusal(f"phase callee {name_} is {why}" if why == _REFERENCE else
                               f"phase callee {name_} is named {why}", cls, self._range(ref).start.line)
            if hits:
                if st.nowhere:
                    raise _Refusal(f"phase call {callee_of(hits[0][2])}(...) sits in {st.nowhere}: no line can be "
                                   "added around it", cls, line)
                if len(hits) > 1:
                    raise _Refusal(
                        f"one statement holds several phase calls ({', '.join(callee_of(h[2]) for h in hits)}): "
                        "ambiguous", cls, line)
                i, pc, call, _why = hits[0]
                if i in seen:
                    raise _Refusal(
                        f"phase {pc.name!r} ({_callees(pc)}) appears twice in {method} (lines {seen[i]} and {line}): "
                        "ambiguous, nothing instrumented", cls, line)
                seen[i] = line
                if pos.pauses:
                    raise _Refusal(f"phase call {callee_of(call)}(...) shares its statement with a yield or an await: "
                                   "the method may pause inside the phase", cls, line)
                phases.append(self._phase_site(cls, method, entry, pc, st.node, call))
                for fa in fam.facts:
                    if fa.after == pc.name:
                        self._fact(cls, method, fa, st.node, facts)
            else:
                calls = [c for c, why in pos.calls if why is None]
                for fa in fam.facts:
                    if fa.after_call and not st.nowhere and any(
                        get_full_name_for_node(c.func) == fa.after_call for c in calls
                    ):
                        self._fact(cls, method, fa, st.node, facts)
        return phases, facts, set(seen)

    def _statement_lines(self, cls: str, node: cst.CSTNode) -> tuple[int, int]:
        """The 0-based first and last lines of a statement (a SimpleStatementLine: it starts its line); refused
        when it is the file's last line without a newline (nothing can follow it)."""
        rng = self._range(node)
        start, end = rng.start.line - 1, rng.end.line - 1
        if not self.lines[end].endswith(("\n", "\r")):
            raise _Refusal("a phase statement ends the file without a newline", cls, rng.end.line)
        return start, end

    def _phase_site(self, cls: str, method: str, entry: str, pc: PhaseCall, node: cst.CSTNode,
                    call: cst.Call) -> PhaseSite:
        start, end = self._statement_lines(cls, node)
        assert isinstance(node, cst.SimpleStatementLine)  # headers and one-line suites are refused before
        callee = callee_of(call)
        # The small statement holding the call (the last one starting at or before it), and what follows it.
        where = (self._range(call).start.line, self._range(call).start.column)
        at = max(k for k, small in enumerate(node.body)
                 if (self._range(small).start.line, self._range(small).start.column) <= where)
        holder = node.body[at]
        if isinstance(holder, cst.Assert):
            raise _Refusal(f"phase call {callee}(...) sits in an assert: python -O skips it", cls, start + 1)
        if isinstance(holder, cst.Raise):
            raise _Refusal(f"phase call {callee}(...) sits in a raise statement: the end line would never run",
                           cls, start + 1)
        jump = next((s for s in node.body[at + 1:] if isinstance(s, (cst.Return, cst.Raise, cst.Break, cst.Continue))),
                    None)
        if jump is not None:
            word = {cst.Return: "return", cst.Raise: "raise", cst.Break: "break", cst.Continue: "continue"}[type(jump)]
            raise _Refusal(f"phase call {callee}(...) is followed on its line by '{word}': the end line would never "
                           "run", cls, start + 1)
        is_return = isinstance(holder, cst.Return)
        if is_return and method != entry:
            raise _Refusal(f"phase call {callee}(...) sits in a return statement of {method}, not of the entry "
                           f"method {entry}: no end line can follow it, and the phase would stay open while {entry} "
                           "goes on", cls, start + 1)
        self.inserts.append(_Insert(start - 1, start, f'{ALIAS}.begin("{pc.name}", "{pc.mode}")', indented=True))
        if not is_return:
            self.inserts.append(_Insert(end, start, f'{ALIAS}.end("{pc.name}")', indented=True))
        return PhaseSite(
            phase=pc.name,
            mode=pc.mode,
            method=method,
            call=callee,
            line=start + 1,
            end_line=end + 1,
            form="return" if is_return else "statement",
        )

    def _fact(self, cls: str, method: str, fa: Fact, node: cst.CSTNode, out: list[FactSite]) -> None:
        if isinstance(node, cst.SimpleStatementLine) and any(isinstance(s, cst.Return) for s in node.body):
            return
        bound = _bound_names(node)
        chosen = None
        for cand in fa.from_:
            if cand == "$":
                chosen = _single_target(node)
            elif cand in bound:
                chosen = cand
            if chosen:
                break
        if chosen is None:
            return
        start, end = self._statement_lines(cls, node)
        attrs = "(" + "".join(f'"{a}", ' for a in fa.attrs)[:-1] + ")"  # ("a", "b",) or ()
        self.inserts.append(_Insert(end, start, f"{ALIAS}.accepted({chosen}, {attrs}, {fa.bonus_per_req})",
                                    indented=True))
        out.append(FactSite(fa.name, method, chosen, fa.attrs, fa.bonus_per_req, start + 1))

    def import_insert(self) -> _Insert:
        """After the last top-level import that precedes the first class or def (after docstring/future)."""
        after = -1
        for i, stmt in enumerate(self.tree.body):
            if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                after = (stmt.end_lineno or stmt.lineno) - 1
            elif i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(
                stmt.value.value, str
            ):
                after = (stmt.end_lineno or stmt.lineno) - 1  # the module docstring
        return _Insert(after, max(after, 0), IMPORT_CODE, indented=False)


# ----------------------------------------------------------------------------------------------------------------
# Public functions


def _newline_of(line: str) -> str:
    """The line end of ``line``. (Every line an added line copies ends with one: the ``def`` line, the first line
    of a statement checked by ``_statement_lines``, an import that a class follows.)"""
    return "\r\n" if line.endswith("\r\n") else "\r" if line.endswith("\r") else "\n"


def _render(lines: Sequence[str], inserts: list[_Insert]) -> str:
    by_pos: dict[int, list[_Insert]] = {}
    for ins in inserts:
        by_pos.setdefault(ins.after_line, []).append(ins)
    out: list[str] = []

    def emit(pos: int) -> None:
        for ins in by_pos.get(pos, ()):
            anchor = lines[ins.anchor_line]
            indent = anchor[: len(anchor) - len(anchor.lstrip(" \t"))] if ins.indented else ""
            out.append(f"{indent}{ins.code}  {MARKER}{_newline_of(anchor)}")

    emit(-1)
    for i, line in enumerate(lines):
        out.append(line)
        emit(i)
    return "".join(out)


def strip(source: str) -> str:
    """Remove what ``instrument`` added and return the rest byte for byte (a leading BOM stays first).

    A line is removed when it has exactly the shape of a line eaglepatch writes (``marks.OUR_LINE``) and Python's
    tokenizer agrees that it is a statement or decorator of its own ending with the marker comment: a marker
    inside a string, or a look-alike line inside brackets or after a backslash, stays. A user's line that merely
    ends with the marker is never removed. When the tokenizer cannot read the file, the shape alone decides.
    """
    bom = BOM if source.startswith(BOM) else ""
    return bom + _strip(source[len(bom):])[0]


def _strip(source: str) -> tuple[str, list[int]]:
    """``strip(source)`` (no BOM), and for each line of it (0-based) the 0-based line of ``source`` it comes from."""
    lines = split_lines(source)
    drop = _ours(lines)
    kept = [i for i in range(len(lines)) if i not in drop]
    return "".join(lines[i] for i in kept), kept


def _ours(lines: list[str]) -> set[int]:
    """The 0-based lines (Python's lines, ``split_lines``) that eaglepatch added: see ``strip``."""
    by_shape = {i for i, line in enumerate(lines) if MARKER in line and OUR_LINE.match(line)}
    if not by_shape:
        return by_shape
    real = _marker_statements(lines)
    return by_shape if real is None else by_shape & real


def _marker_statements(lines: list[str]) -> set[int] | None:
    """0-based lines that hold a whole logical line ending in a comment (``x = 1  # c``, not a line inside brackets
    or after a backslash, not text inside a string); None when the tokenizer cannot read the text. (``_ours``
    keeps those of eaglepatch's shape, whose comment is then the marker.) Lines are given to the tokenizer ending
    in ``\n``: a lone ``\r`` ends a line in Python, but the tokenize module of 3.11 reads it as an error token;
    columns and line numbers stay the same."""
    norm = iter([line[:-1] + "\n" if line.endswith("\r") else line for line in lines])
    out: set[int] = set()
    starts: set[int] = set()  # lines where a logical line starts
    at_start = True  # the next significant token starts a logical line
    comment = 0  # the line of the last comment
    try:
        for tok in tokenize.generate_tokens(lambda: next(norm, "")):
            kind, line = tok.type, tok.start[0]
            if kind == tokenize.NEWLINE:  # a logical line ends: with a comment on its own last line?
                if comment == line and line in starts:
                    out.add(line - 1)
                at_start = True
            elif kind == tokenize.COMMENT:
                comment = line
            elif kind not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                if at_start:
                    starts.add(line)
                at_start = False
    except Exception:  # tokenize.TokenError, SyntaxError (3.12+), IndentationError: the shape alone decides
        return None
    return out


def _foreign(lines: list[str], ours: set[int]) -> int | None:
    """The first 0-based line that ends with the marker comment but is not one eaglepatch added, else None."""
    for i, line in enumerate(lines):
        if i not in ours and MARKER in line and MARKED_LINE.search(line):
            return i
    return None


def analyze(source: str, path: str, recipe: Recipe) -> TransformResult:
    """What ``instrument`` would find, with lines of ``source`` as given (patched or not)."""
    return _instrument(source, path, recipe, render=False)


def instrument(source: str, path: str, recipe: Recipe) -> TransformResult:
    """Instrument every recipe class in ``source``; see the module docstring for the result values.

    An already instrumented file is first stripped, so instrumenting twice equals instrumenting once, and a file
    patched by an older recipe is brought up to date. A file holding a line that ends with the marker comment
    but is not one eaglepatch writes, or with marked lines but without eaglepatch's import line, is refused:
    eaglepatch could not tell its own lines from the user's.
    """
    return _instrument(source, path, recipe, render=True)


def _source_line(line: int | None, kept: list[int] | None) -> int | None:
    """A 1-based line of the stripped text as the 1-based line of the file given (``kept`` from ``_strip``). A
    line past the stripped text's end (a parse error at its end) is as far past the last line kept."""
    if line is None or kept is None or line < 1:
        return line
    if line <= len(kept):
        return kept[line - 1] + 1
    return kept[-1] + 1 + line - len(kept)


def _input_line(new: str, line: int | None, kept: list[int] | None) -> int | None:
    """A 1-based line of the instrumented text ``new`` as a line of the file given: the original line it is, or
    the next one when it is a line eaglepatch added."""
    if line is None:
        return None
    added = _ours(split_lines(new))
    original = sum(1 for i in range(line - 1) if i not in added) + 1
    return _source_line(original, kept)


def _instrument(source: str, path: str, recipe: Recipe, render: bool) -> TransformResult:
    bom = BOM if source.startswith(BOM) else ""  # kept first; the rest is worked on without it
    text = source[len(bom):]
    lines = split_lines(text)
    ours = _ours(lines)
    alien = _foreign(lines, ours)
    if alien is not None:
        return Refused(path, f"this line ends with {MARKER!r}, the comment eaglepatch puts on the lines it adds, "
                       "but it is not a line eaglepatch writes: eaglepatch could not tell its own lines from it; "
                       "change that comment", None, alien + 1)
    if ours and not any(lines[i].startswith(IMPORT_CODE) for i in ours):
        return Refused(path, f"this file has lines marked {MARKER!r} but not eaglepatch's import line "
                       f"({IMPORT_CODE}): not a file eaglepatch patched; remove the marked lines", None,
                       min(ours) + 1)
    was_patched = bool(ours)
    kept: list[int] | None = None  # stripped line -> line of ``text`` (0-based), when stripped
    original = text
    if render:  # instrument works on the original: a patched file is stripped first
        original, kept = _strip(text)
    try:
        finder = _Finder(original, path, recipe)
        workers = finder.run()
    except _Refusal as r:
        if was_patched and r.reason.startswith("does not parse ("):
            try:  # Python's own words about the file as given ("... on line N" are its lines)
                ast.parse(text)
            except SyntaxError as exc:
                return Refused(path, f"does not parse ({exc.msg})", None, exc.lineno)
            return Refused(path, f"once eaglepatch's lines are taken out, the file {r.reason} (the line it names is "
                           "one of that text)", None, _source_line(r.line, kept))
        return Refused(path, r.reason, r.cls, _source_line(r.line, kept))
    supported = [w for w in workers if w.status == "supported"]
    if not supported:
        if workers:
            reasons = "; ".join(f"{w.cls}: {w.reason}" for w in workers)
            return NotApplicable(path, reasons, tuple(workers))
        return NotApplicable(path, "no speculative worker class of the recipe in this file", ())
    if not render:
        return Instrumented(path, source, tuple(workers), tuple(finder.warnings), False, was_patched)
    inserts = finder.inserts + [finder.import_insert()]
    new = _render(finder.lines, inserts)
    # Check our own output before anyone writes it (Black's habit): it compiles, it strips back to the input, and
    # what ast reads in it is the input with exactly the statements we meant, where we meant them.
    try:  # parsed once: compiled from its tree (the compiler's own checks), then that tree is checked
        new_tree = ast.parse(new, path)
        compile(new_tree, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Refused(path, f"internal error: the instrumented file does not compile ({exc.msg})", None, exc.lineno)
    except (ValueError, RecursionError, MemoryError) as exc:
        return Refused(path, f"internal error: the instrumented file does not compile ({exc})")
    if strip_lines(new) != original:
        return Refused(path, "internal error: removing the added lines would not give back the original")
    problem = check_output(finder.tree, new_tree, workers)
    if problem is not None:
        return Refused(path, f"internal error: {problem[0]}; nothing instrumented", problem[1],
                       _input_line(new, problem[2], kept))
    return Instrumented(path, bom + new, tuple(workers), tuple(finder.warnings), bom + new != source, was_patched)


# ----------------------------------------------------------------------------------------------------------------
# The output check: what ast reads in the instrumented text, independently of how the lines were placed


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
