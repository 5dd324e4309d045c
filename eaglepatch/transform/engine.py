"""The pure core: a worker module's source text in, a result value out. No files, no SSH, no printing.

``instrument(source, path, recipe)`` finds each recipe class's entry method and phase calls by their shape (libcst)
and returns ``Instrumented`` (new text plus what it found), ``NotApplicable`` (no class of the recipe in this file)
or ``Refused`` (the reason, with file, class and line). ``strip(source)`` removes what ``instrument`` added.

What the patch adds is only whole lines, each ending with ``MARKER``: the runtime import, a decorator on the entry
method, ``begin``/``end`` lines around each phase statement and an ``accepted`` line after the verify statement.
So removing the marked lines gives back the original bytes, and ``git diff`` of a patched file shows only ``+``.
Before returning, ``instrument`` checks its own output: it compiles, and stripping it gives back the input.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Iterator, Sequence, Union

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from eaglepatch.transform.marks import MARKED_LINE as _MARKED_LINE
from eaglepatch.transform.marks import MARKER, RUNTIME_MODULE, is_instrumented, strip_lines
from eaglepatch.transform.recipe import Fact, Family, PhaseCall, Recipe

__all__ = ["MARKER", "RUNTIME_MODULE", "Instrumented", "NotApplicable", "Refused", "TransformResult", "WorkerInfo",
           "analyze", "instrument", "is_instrumented", "strip", "strip_lines"]

ALIAS = "_eaglepatch"
IMPORT_LINE = f"from . import {RUNTIME_MODULE} as {ALIAS}  {MARKER}"
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
    base class's instrumented method times it), or ``unsupported`` (with ``reason``).
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
        super().__init__(reason)
        self.reason, self.cls, self.line = reason, cls, line


# ----------------------------------------------------------------------------------------------------------------
# Reading the tree


# Fields of a node that hold no call: brackets, whitespace, commas, operators, names after ``as``/``=``.
_NO_CALLS = frozenset({"lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "leading_lines", "comma",
                       "semicolon", "equal", "dot", "first_colon", "second_colon", "star", "operator", "asname",
                       "keyword", "start", "end", "conversion", "asynchronous"})
_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields(t: type) -> tuple[str, ...]:
    """The fields of a node type that may hold a call, in the order of the source (a CSTVisitor's order)."""
    names = _FIELDS.get(t)
    if names is None:
        if t is cst.IfExp:  # "body if test else orelse": its fields are declared test first
            names = ("body", "test", "orelse")
        else:
            names = tuple(f.name for f in dataclasses.fields(t) if f.name not in _NO_CALLS and "whitespace" not in f.name)
        _FIELDS[t] = names
    return names


def _calls_in(node: cst.CSTNode) -> list[cst.Call]:
    """Every call inside ``node`` in source order, not descending into lambdas, nested functions or classes.

    A walk over the nodes' fields: what a CSTVisitor finds, in its order, at a tenth of its cost."""
    found: list[cst.Call] = []

    def walk(n: cst.CSTNode) -> None:
        if isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
            return
        if isinstance(n, cst.Call):
            found.append(n)
        for name in _fields(type(n)):
            v = getattr(n, name)
            if isinstance(v, cst.CSTNode):
                walk(v)
            elif isinstance(v, (tuple, list)):
                for x in v:
                    if isinstance(x, cst.CSTNode):
                        walk(x)

    walk(node)
    return found


def _kwarg_names(call: cst.Call) -> set[str]:
    return {a.keyword.value for a in call.args if a.keyword is not None}


def _matches(call: cst.Call, pc: PhaseCall | None, callee: str) -> bool:
    if get_full_name_for_node(call.func) != callee:
        return False
    if pc is None:
        return True
    kws = _kwarg_names(call)
    return all(k in kws for k in pc.with_kwargs) and not any(k in kws for k in pc.without_kwargs)


def _parts(stmt: cst.BaseCompoundStatement) -> Iterator[tuple[bool, cst.CSTNode]]:
    """A compound statement's pieces in source order: ``(True, expr)`` for an expression of a header line (where no
    line can be inserted), ``(False, suite)`` for a suite.

    ``if``: its test, its body, then each ``elif``'s test and body, then the ``else``; loops and ``with``: the
    header, the body, the ``else``; ``try``: the body, each handler's type and body, ``else``, ``finally``;
    ``match``: the subject, then each case's guard and body. Nested functions and classes yield nothing.
    """
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return
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
    node: cst.CSTNode  # SimpleStatementLine, or the compound statement whose header holds a call
    in_suite: bool  # True: a one-line suite ("if x: call()") or a compound header, where no line can go
    header: bool


def _walk(suite: cst.BaseSuite) -> Iterator[_Stmt]:
    """Statements of a suite in source order, recursing into compound statements."""
    if isinstance(suite, cst.SimpleStatementSuite):
        yield _Stmt(suite, in_suite=True, header=False)
        return
    for stmt in suite.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            yield _Stmt(stmt, in_suite=False, header=False)
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        else:
            for is_header, part in _parts(stmt):
                if is_header:
                    yield _Stmt(part, in_suite=True, header=True)
                else:
                    yield from _walk(part)


def _bound_names(stmt: cst.CSTNode) -> list[str]:
    """Names a simple statement binds: assignment targets, including inside tuples."""
    names: list[str] = []

    def collect(t: cst.BaseExpression) -> None:
        if isinstance(t, cst.Name):
            names.append(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for el in t.elements:
                collect(el.value)
        elif isinstance(t, cst.StarredElement):
            collect(t.value)

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
    after_line: int  # 0-based index of the original line this goes after; -1 = at the very top
    order: int  # same position: import (-1), phase end (1), fact (2), phase begin (3), decorator (4)
    anchor_line: int  # 0-based line whose indentation and line ending the new line copies
    code: str


class _Finder:
    def __init__(self, source: str, path: str, recipe: Recipe):
        self.source, self.path, self.recipe = source, path, recipe
        self.lines = source.splitlines(keepends=True)
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
            head, first = "class _eaglepatch_holder:\n", cls.body[at - 1].end_lineno or cls.body[at - 1].lineno
        text = head + "".join(self.lines[first : fn.end_lineno])
        if not text.endswith(("\n", "\r")):
            text += "\n"
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
        holder = module.body[0]
        assert isinstance(holder, cst.ClassDef) and isinstance(holder.body, cst.IndentedBlock)
        found = [s for s in holder.body.body if isinstance(s, cst.FunctionDef) and s.name.value == fn.name]
        node = found[-1]
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        shift = fn.lineno - positions[node].start.line
        for n, r in positions.items():
            self.pos[n] = CodeRange((r.start.line + shift, r.start.column), (r.end.line + shift, r.end.column))
        return node

    def _range(self, node: cst.CSTNode) -> CodeRange:
        return self.pos[node]

    def _ast_method(self, cls: str, method: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
        found = None
        for n in self.ast_classes[cls].body:
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method:
                found = n
        assert found is not None
        return found

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
                              reason="inherits its entry method: timed through the base class")
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
            return WorkerInfo(cls=name, family=fam.name, status="inherits", reason="no entry method of its own")
        if len(entries) > 1:
            raise _Refusal(f"both {entries[0]} and {entries[1]} are defined: which is the entry?", name,
                           self._def_line(name, entries[1]))
        # libcst parses only the methods it scans (the entry method and the family's helpers), not the file.
        scanned = [self._parse_method(cls, methods[m]) for m in [entries[0]] + [h for h in fam.helpers if h in methods]]
        entry = scanned[0]
        rng = self._range(entry)
        if entry.asynchronous is not None:
            raise _Refusal(f"{entry.name.value} is async: not a shape eaglepatch knows", name, rng.start.line)
        phases: list[PhaseSite] = []
        facts: list[FactSite] = []
        for fn in scanned:
            p, f = self._scan_method(name, fam, fn)
            phases.extend(p)
            facts.extend(f)
        for pc in fam.phases:
            if pc.required and not any(p.phase == pc.name and p.call == pc.call and p.mode == pc.mode for p in phases):
                raise _Refusal(
                    f"phase {pc.name!r} ({pc.call}(...)) not found in {entries[0]}"
                    + (f" or {', '.join(h for h in fam.helpers if h in methods)}" if scanned[1:] else "")
                    + ": unknown layout, nothing instrumented",
                    name,
                    rng.start.line,
                )
        if fam.facts and not facts:
            self.warnings.append(f"{self.path}: {name}: accepted tokens not found; records will carry accepted=null")
        for fa in fam.facts:
            if fa.required and not any(f.expr in fa.from_ or "$" in fa.from_ for f in facts):
                raise _Refusal("the accepted-tokens value the recipe requires is not found", name, rng.start.line)
        # The decorator goes above the def (or above its first decorator).
        first = self._range(entry.decorators[0]).start.line if entry.decorators else rng.start.line
        self.inserts.append(_Insert(first - 2, 4, first - 1, f"@{ALIAS}.entry"))
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
        )

    def _scan_method(self, cls: str, fam: Family, fn: cst.FunctionDef) -> tuple[list[PhaseSite], list[FactSite]]:
        method = fn.name.value
        phases: list[PhaseSite] = []
        facts: list[FactSite] = []
        seen: dict[int, int] = {}  # index of PhaseCall -> line already found in this method
        for st in _walk(fn.body):
            calls = _calls_in(st.node)
            hits = []
            for call in calls:
                callee = get_full_name_for_node(call.func)
                if callee is None:
                    continue
                for i, pc in enumerate(fam.phases):
                    if _matches(call, pc, pc.call):
                        hits.append((i, pc, call))
            line = self._range(st.node).start.line
            if hits:
                if st.in_suite:
                    what = "a compound statement's header" if st.header else "a one-line compound statement"
                    raise _Refusal(f"phase call {hits[0][1].call}(...) sits in {what}: no line can be added around it",
                                   cls, line)
                if len(hits) > 1:
                    raise _Refusal(
                        f"one statement holds several phase calls ({', '.join(h[1].call for h in hits)}): ambiguous",
                        cls, line)
                i, pc, _call = hits[0]
                if i in seen:
                    raise _Refusal(
                        f"phase {pc.name!r} ({pc.call}(...)) appears twice in {method} (lines {seen[i]} and {line}): "
                        "ambiguous, nothing instrumented", cls, line)
                seen[i] = line
                phases.append(self._phase_site(cls, method, pc, st.node))
                for fa in fam.facts:
                    if fa.after == pc.name:
                        self._fact(cls, method, fa, st.node, facts)
            else:
                for fa in fam.facts:
                    if fa.after_call and not st.in_suite and any(
                        get_full_name_for_node(c.func) == fa.after_call for c in calls
                    ):
                        self._fact(cls, method, fa, st.node, facts)
        return phases, facts

    def _check_line_start(self, cls: str, node: cst.CSTNode) -> tuple[int, int]:
        rng = self._range(node)
        start, end = rng.start.line - 1, rng.end.line - 1
        before = self.lines[start][: rng.start.column]
        if before.strip():
            raise _Refusal("a phase statement does not start its line", cls, rng.start.line)
        if not self.lines[end].endswith(("\n", "\r")):
            raise _Refusal("a phase statement ends the file without a newline", cls, rng.end.line)
        return start, end

    def _phase_site(self, cls: str, method: str, pc: PhaseCall, node: cst.CSTNode) -> PhaseSite:
        start, end = self._check_line_start(cls, node)
        is_return = isinstance(node, cst.SimpleStatementLine) and any(isinstance(s, cst.Return) for s in node.body)
        self.inserts.append(_Insert(start - 1, 3, start, f'{ALIAS}.begin("{pc.name}", "{pc.mode}")'))
        if not is_return:
            self.inserts.append(_Insert(end, 1, start, f'{ALIAS}.end("{pc.name}")'))
        return PhaseSite(
            phase=pc.name,
            mode=pc.mode,
            method=method,
            call=pc.call,
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
        start, end = self._check_line_start(cls, node)
        attrs = "(" + "".join(f'"{a}", ' for a in fa.attrs).rstrip(" ") + ")" if fa.attrs else "()"
        self.inserts.append(_Insert(end, 2, start, f"{ALIAS}.accepted({chosen}, {attrs}, {fa.bonus_per_req})"))
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
        anchor = after if after >= 0 else 0
        return _Insert(after, -1, anchor, IMPORT_LINE.split(f"  {MARKER}")[0])


# ----------------------------------------------------------------------------------------------------------------
# Public functions


def _newline_of(line: str, default: str) -> str:
    for nl in ("\r\n", "\n", "\r"):
        if line.endswith(nl):
            return nl
    return default


def _render(lines: Sequence[str], inserts: list[_Insert], default_nl: str) -> str:
    by_pos: dict[int, list[_Insert]] = {}
    for ins in inserts:
        by_pos.setdefault(ins.after_line, []).append(ins)
    out: list[str] = []

    def emit(pos: int) -> None:
        for ins in sorted(by_pos.get(pos, ()), key=lambda i: i.order):
            anchor = lines[ins.anchor_line] if lines else ""
            indent = anchor[: len(anchor) - len(anchor.lstrip(" \t"))] if ins.order >= 0 else ""
            out.append(f"{indent}{ins.code}  {MARKER}{_newline_of(anchor, default_nl)}")

    emit(-1)
    for i, line in enumerate(lines):
        out.append(line)
        emit(i)
    return "".join(out)


def strip(source: str) -> str:
    """Remove what ``instrument`` added and return the rest byte for byte.

    libcst finds the statements and decorators that carry the marker comment; their lines are removed. When that
    count and the count of marked lines differ (a marker merged into someone's own code, a marker in a string),
    or the file no longer parses, only the lines that have exactly the shape eaglepatch writes are removed.
    """
    return _strip(source)[0]


def _strip(source: str) -> tuple[str, list[int]]:
    """``strip(source)``, and for each line of it (0-based) the 0-based line of ``source`` it comes from."""
    lines = source.splitlines(keepends=True)
    drop = _dropped(source, lines)
    kept = [i for i in range(len(lines)) if i not in drop]
    return "".join(lines[i] for i in kept), kept


def _dropped(source: str, lines: list[str]) -> set[int]:
    """The 0-based lines of ``source`` (split as ``lines``) that ``strip`` removes; see ``strip``."""
    if MARKER not in source:
        return set()
    by_shape = {i for i, line in enumerate(lines) if _MARKED_LINE.match(line)}
    try:
        module = cst.parse_module(source)
    except (cst.ParserSyntaxError, RecursionError):
        return by_shape
    found = _MarkedNodes()
    module.visit(found)
    if len(found.nodes) == len(by_shape):
        return by_shape
    # Rare: something that looks like our line but is not ours (inside a string, say). Remove by position.
    pos = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return {pos[n].start.line - 1 for n in found.nodes if pos[n].start.line == pos[n].end.line}


class _MarkedNodes(cst.CSTVisitor):
    """Collects the statements and decorators that carry the marker comment: what eaglepatch added."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: list[cst.CSTNode] = []

    def _visit(self, node: cst.SimpleStatementLine | cst.Decorator) -> bool:
        comment = node.trailing_whitespace.comment
        if comment is not None and comment.value == MARKER:
            self.nodes.append(node)
        return False

    visit_SimpleStatementLine = _visit
    visit_Decorator = _visit


def analyze(source: str, path: str, recipe: Recipe) -> TransformResult:
    """What ``instrument`` would find, with lines of ``source`` as given (patched or not)."""
    return _instrument(source, path, recipe, render=False)


def instrument(source: str, path: str, recipe: Recipe) -> TransformResult:
    """Instrument every recipe class in ``source``; see the module docstring for the result values.

    An already instrumented file is first stripped, so instrumenting twice equals instrumenting once, and a file
    patched by an older recipe is brought up to date.
    """
    return _instrument(source, path, recipe, render=True)


def _source_line(line: int | None, kept: list[int] | None, total: int) -> int | None:
    """A 1-based line of the stripped text as the 1-based line of the file given, which has ``total`` lines
    (``kept`` from ``_strip``). A line past the stripped text's end (a parse error at the end) stays past the end.
    """
    if line is None or kept is None or line < 1:
        return line
    if line <= len(kept):
        return kept[line - 1] + 1
    return total + (line - len(kept))


def _instrument(source: str, path: str, recipe: Recipe, render: bool) -> TransformResult:
    was_patched = is_instrumented(source)
    kept: list[int] | None = None  # stripped line -> line of ``source`` (0-based), when stripped
    original = source
    if was_patched and render:
        original, kept = _strip(source)
    try:
        finder = _Finder(original, path, recipe)
        workers = finder.run()
    except _Refusal as r:
        return Refused(path, r.reason, r.cls, _source_line(r.line, kept, len(source.splitlines())))
    supported = [w for w in workers if w.status == "supported"]
    if not supported:
        if workers:
            reasons = "; ".join(f"{w.cls}: {w.reason}" for w in workers)
            return NotApplicable(path, reasons, tuple(workers))
        return NotApplicable(path, "no speculative worker class of the recipe in this file", ())
    if not render:
        return Instrumented(path, source, tuple(workers), tuple(finder.warnings), False, was_patched)
    inserts = finder.inserts + [finder.import_insert()]
    default_nl = _newline_of(finder.lines[0], "\n") if finder.lines else "\n"
    new = _render(finder.lines, inserts, default_nl)
    # Check our own output before anyone writes it (Black's habit): it compiles, and it strips back to the input.
    try:
        compile(new, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Refused(path, f"internal error: the instrumented file does not compile ({exc.msg})", None, exc.lineno)
    if strip_lines(new) != original:
        return Refused(path, "internal error: removing the added lines would not give back the original")
    return Instrumented(path, new, tuple(workers), tuple(finder.warnings), new != source, was_patched)
