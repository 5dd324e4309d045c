"""Finding what to instrument in one file: each recipe class's entry method, phase calls and facts, as lines to add.

The standard ast reads the file (classes, methods, lines); libcst parses only the methods scanned (the entry method
and the family's helpers). ``Finder.run`` returns a ``WorkerInfo`` per worker class and collects the lines to add
(``Insert``) and the warnings; what it will not guess is a ``Refusal`` with the reason, class and line.

A phase call is timed only where its statement's lines bracket exactly that call: a call that may not run when its
statement runs (``a if c else b``, ``a or b``, a chained comparison), that runs later or elsewhere (a lambda, a
comprehension, a nested function, a default argument, a bare reference), or whose end line could not run (``; break``
on its line, a ``return`` in a helper method) is refused, never bracketed.
"""

from __future__ import annotations

import ast
import dataclasses
import re

import libcst as cst
from libcst.helpers import get_full_name_for_node
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from eaglepatch.transform.marks import ALIAS, IMPORT_CODE, split_lines
from eaglepatch.transform.recipe import Fact, Family, PhaseCall, Recipe
from eaglepatch.transform.results import FactSite, PhaseSite, WorkerInfo
from eaglepatch.transform.tree import (
    REFERENCE,
    bound_names,
    call_positions,
    callee_of,
    matches,
    phase_callees,
    single_target,
    walk_statements,
)

# The position libcst writes into a ParserSyntaxError's message.
_ERROR_AT = re.compile(r"error at (\d+):(\d+)")


class Refusal(Exception):
    """What the finder will not guess: ``instrument`` turns it into a ``Refused`` (lines are the text's it read)."""

    def __init__(self, reason: str, cls: str | None = None, line: int | None = None):
        self.reason, self.cls, self.line = reason, cls, line


@dataclasses.dataclass
class Insert:
    """A line to add after ``after_line`` (0-based; -1: at the very top). Lines added at one position keep the
    order they were found in: a phase's end, the fact read after it, the next phase's begin."""

    after_line: int
    anchor_line: int  # 0-based line whose line ending (and indentation, if ``indented``) the new line copies
    code: str
    indented: bool  # the runtime import is not: it goes at the top level whatever its anchor


class Finder:
    """One file's search: ``run()`` gives its worker classes; ``inserts`` and ``warnings`` fill as it goes."""

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
            raise Refusal(f"does not parse ({exc.msg})", line=exc.lineno) from None
        except (ValueError, RecursionError, MemoryError) as exc:  # a NUL byte before 3.12 is a ValueError
            raise Refusal(f"does not parse with this Python ({exc})") from None
        self.ast_classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        self.pos: dict[cst.CSTNode, CodeRange] = {}
        self.warnings: list[str] = []
        self.inserts: list[Insert] = []

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
            raise Refusal(f"does not parse: {message}", line=line + offset) from None
        except RecursionError:
            raise Refusal("does not parse: nested too deeply", line=fn.lineno) from None
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
            raise Refusal(f"both {entries[0]} and {entries[1]} are defined: which is the entry?", name,
                           self._def_line(name, entries[1]))
        # libcst parses only the methods it scans (the entry method and the family's helpers), not the file.
        helpers = [h for h in fam.helpers if h in methods and h != entries[0]]
        scanned = [self._parse_method(cls, methods[m]) for m in [entries[0]] + helpers]
        entry = scanned[0]
        rng = self._range(entry)
        if entry.asynchronous is not None:
            raise Refusal(f"{entry.name.value} is async: not a shape eaglepatch knows", name, rng.start.line)
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
                raise Refusal(f"phase {pc.name!r} ({phase_callees(pc)}) not found in {where}: unknown layout, "
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
                raise Refusal("the accepted-tokens value the recipe requires is not found", name, rng.start.line)
        # The decorator goes above the def (or above its first decorator).
        first = self._range(entry.decorators[0]).start.line if entry.decorators else rng.start.line
        self.inserts.append(Insert(first - 2, first - 1, f"@{ALIAS}.entry", indented=True))
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
        for st in walk_statements(fn.body):
            pos = call_positions(st.node, callees, lasts)
            hits = []
            for call, why in pos.calls:
                callee = get_full_name_for_node(call.func)
                if callee not in callees:
                    continue
                for i, pc in enumerate(fam.phases):
                    if matches(call, pc, callee):
                        hits.append((i, pc, call, why))
            line = self._range(st.node).start.line
            for i, pc, call, why in hits:
                if why is not None:
                    raise Refusal(f"phase call {callee_of(call)}(...) sits {why}", cls, self._range(call).start.line)
            if pos.refs:
                ref, why = pos.refs[0]
                name_ = get_full_name_for_node(ref)
                raise Refusal(f"phase callee {name_} is {why}" if why == REFERENCE else
                               f"phase callee {name_} is named {why}", cls, self._range(ref).start.line)
            if hits:
                if st.nowhere:
                    raise Refusal(f"phase call {callee_of(hits[0][2])}(...) sits in {st.nowhere}: no line can be "
                                   "added around it", cls, line)
                if len(hits) > 1:
                    raise Refusal(
                        f"one statement holds several phase calls ({', '.join(callee_of(h[2]) for h in hits)}): "
                        "ambiguous", cls, line)
                i, pc, call, _why = hits[0]
                if i in seen:
                    raise Refusal(
                        f"phase {pc.name!r} ({phase_callees(pc)}) appears twice in {method} "
                        f"(lines {seen[i]} and {line}): ambiguous, nothing instrumented", cls, line)
                seen[i] = line
                if pos.pauses:
                    raise Refusal(f"phase call {callee_of(call)}(...) shares its statement with a yield or an await: "
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
            raise Refusal("a phase statement ends the file without a newline", cls, rng.end.line)
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
            raise Refusal(f"phase call {callee}(...) sits in an assert: python -O skips it", cls, start + 1)
        if isinstance(holder, cst.Raise):
            raise Refusal(f"phase call {callee}(...) sits in a raise statement: the end line would never run",
                           cls, start + 1)
        jump = next((s for s in node.body[at + 1:] if isinstance(s, (cst.Return, cst.Raise, cst.Break, cst.Continue))),
                    None)
        if jump is not None:
            word = {cst.Return: "return", cst.Raise: "raise", cst.Break: "break", cst.Continue: "continue"}[type(jump)]
            raise Refusal(f"phase call {callee}(...) is followed on its line by '{word}': the end line would never "
                           "run", cls, start + 1)
        is_return = isinstance(holder, cst.Return)
        if is_return and method != entry:
            raise Refusal(f"phase call {callee}(...) sits in a return statement of {method}, not of the entry "
                           f"method {entry}: no end line can follow it, and the phase would stay open while {entry} "
                           "goes on", cls, start + 1)
        self.inserts.append(Insert(start - 1, start, f'{ALIAS}.begin("{pc.name}", "{pc.mode}")', indented=True))
        if not is_return:
            self.inserts.append(Insert(end, start, f'{ALIAS}.end("{pc.name}")', indented=True))
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
        bound = bound_names(node)
        chosen = None
        for cand in fa.from_:
            if cand == "$":
                chosen = single_target(node)
            elif cand in bound:
                chosen = cand
            if chosen:
                break
        if chosen is None:
            return
        start, end = self._statement_lines(cls, node)
        attrs = "(" + "".join(f'"{a}", ' for a in fa.attrs)[:-1] + ")"  # ("a", "b",) or ()
        self.inserts.append(Insert(end, start, f"{ALIAS}.accepted({chosen}, {attrs}, {fa.bonus_per_req})",
                                    indented=True))
        out.append(FactSite(fa.name, method, chosen, fa.attrs, fa.bonus_per_req, start + 1))

    def import_insert(self) -> Insert:
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
        return Insert(after, max(after, 0), IMPORT_CODE, indented=False)

