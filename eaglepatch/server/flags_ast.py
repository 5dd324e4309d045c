"""Reading sglang's server arguments from source with ``ast``: which option strings a module's ``add_argument``
calls and annotated dataclass fields register, and whether each takes a value.

``flags.parse_server_flags`` drives it over a release's ``server_args.py`` and the modules it names; each module is
a ``SourceModule`` (its imports, classes and module-level lists), and a ``Context`` finds the class a name stands
for across them, noting the modules it needed and was not given.

``add_cli_args_from_dataclass`` (identical in 0.5.16, 0.5.21 and 0.5.23) decides, field by field:

- a field whose annotation is not ``Annotated`` (``A``), or whose metadata holds neither an ``Arg(...)`` nor a string,
  is no option (e.g. ``reasoning_parser: Optional[str]``: registered by hand instead); ``Arg(no_cli=True)`` is none
  either. Nothing else excludes a field: not a leading underscore (every such field in the pinned releases is
  ``no_cli``), not ``field(init=False)`` (``dataclasses.fields`` lists those too; no pinned release has one).
- the option is ``Arg(cli_name=...)`` if given, else ``"--" + name.replace("_", "-")``; ``Arg(aliases=[...])`` adds
  other spellings.
- no value: ``Arg(action=...)`` decides when given (``argparse.BooleanOptionalAction`` also adds ``--no-x`` for every
  ``--x``); else a ``bool`` field (also ``Optional[bool]``) is ``store_true``. ``Literal``, lists and the rest take
  values.
"""

from __future__ import annotations

import ast
import dataclasses
from types import MappingProxyType
from typing import Mapping

_NO_VALUE_ACTIONS = frozenset({"store_true", "store_false", "store_const", "append_const", "count", "help", "version"})
_NO_VALUE_ACTION_CLASSES = frozenset({
    "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_AppendConstAction", "_CountAction",
    "_HelpAction", "_VersionAction", "BooleanOptionalAction",
})
_HELP = frozenset({"help"})


# ----------------------------------------------------------------------------------------------------------------
# One module's view: its imports, its classes, its module-level lists


@dataclasses.dataclass(frozen=True)
class SourceModule:
    """One module of the release, parsed: its syntax tree and what the lookups need of it."""

    name: str
    tree: ast.Module
    imports: Mapping[str, tuple[str, str]]  # local name -> (module, name in it); "" for `import x`
    classes: Mapping[str, ast.ClassDef]
    lists: Mapping[str, list[ast.expr]]  # NAME = [a, b] / (a, b) at module level


def load_module(name: str, source: str) -> SourceModule | None:
    """The module ``name`` (dotted) of text ``source``; None when it does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    package = name.rpartition(".")[0]
    imports: dict[str, tuple[str, str]] = {}
    classes: dict[str, ast.ClassDef] = {}
    lists: dict[str, list[ast.expr]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([mod] if mod else []))
            for alias in node.names:
                imports[alias.asname or alias.name] = (mod, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = (alias.name if alias.asname else
                                                                     alias.name.split(".")[0], "")
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    lists[target.id] = list(node.value.elts)
    return SourceModule(name, tree, MappingProxyType(imports), MappingProxyType(classes), MappingProxyType(lists))


class Context:
    """The modules known so far, and the ones a lookup found missing."""

    def __init__(self, modules: Mapping[str, SourceModule]):
        self.modules = modules
        self.missing: list[str] = []

    def need(self, name: str) -> SourceModule | None:
        mod = self.modules.get(name)
        if mod is None and name not in self.missing:
            self.missing.append(name)
        return mod

    def resolve_class(self, mod: SourceModule, expr: ast.expr) -> tuple[SourceModule, ast.ClassDef] | None:
        """The class ``expr`` stands for in ``mod``: a class of ``mod``, one imported by ``from sglang.x import
        Name``, or ``alias.Name`` after ``import sglang.x as alias``; None for anything else (argparse's own, a
        third party's, a name bound at run time)."""
        src, name = "", ""
        if isinstance(expr, ast.Name):
            if expr.id in mod.classes:
                return mod, mod.classes[expr.id]
            src, name = mod.imports.get(expr.id, ("", ""))
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            imported, attr = mod.imports.get(expr.value.id, ("", ""))
            src, name = (imported, expr.attr) if imported and not attr else ("", "")
        if src.startswith("sglang.") and name:
            other = self.need(src)
            if other is not None and name in other.classes:
                return other, other.classes[name]
        return None


def _dotted(expr: ast.expr) -> str:
    """``a.b.c`` of a name or attribute chain, else ""."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        parts.append(expr.id)
        return ".".join(reversed(parts))
    return ""


def _last(expr: ast.expr) -> str:
    return _dotted(expr).rpartition(".")[2]


def _const_str(expr: ast.expr | None) -> str | None:
    return expr.value if isinstance(expr, ast.Constant) and isinstance(expr.value, str) else None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


# ----------------------------------------------------------------------------------------------------------------
# Actions: does an option with this action take a value?


def _nargs_zero(expr: ast.expr | None) -> bool | None:
    """True for ``nargs=0``, False for another nargs, None when absent."""
    if expr is None:
        return None
    return isinstance(expr, ast.Constant) and expr.value == 0


def _action_class_no_value(ctx: Context, mod: SourceModule, cls: ast.ClassDef, depth: int = 0) -> bool:
    """Whether an ``argparse.Action`` subclass consumes no argument by default: its ``__init__`` defaults ``nargs``
    to 0 or passes ``nargs=0`` up; else what its base does (``argparse.Action`` itself takes one value)."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            positional = args.posonlyargs + args.args
            defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
            defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
            if "nargs" in defaults:
                return bool(_nargs_zero(defaults["nargs"]))
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and _last(call.func) == "__init__":
                    zero = _nargs_zero(_keyword(call, "nargs"))
                    if zero is not None:
                        return zero
    if depth < 8:
        for base in cls.bases:
            if _last(base) in _NO_VALUE_ACTION_CLASSES:
                return True
            found = ctx.resolve_class(mod, base)
            if found is not None:
                return _action_class_no_value(ctx, found[0], found[1], depth + 1)
    return False


def _action(ctx: Context, mod: SourceModule, action: ast.expr | None, nargs: ast.expr | None) -> tuple[bool, bool]:
    """(takes no value, adds ``--no-x`` forms) for an option registered with ``action`` and ``nargs``."""
    if action is None:
        return bool(_nargs_zero(nargs)), False
    text = _const_str(action)
    if text is not None:
        return text in _NO_VALUE_ACTIONS, False
    name = _last(action)
    if name == "BooleanOptionalAction":
        return True, True
    explicit = _nargs_zero(nargs)
    if explicit is not None:
        return explicit, False
    if name in _NO_VALUE_ACTION_CLASSES:
        return True, False
    found = ctx.resolve_class(mod, action)
    if found is None:
        return False, False
    return _action_class_no_value(ctx, found[0], found[1]), False


# ----------------------------------------------------------------------------------------------------------------
# The options


class Collector:
    """The options found so far: names in order of registration, the ones that take no value, aliases,
    ``no-x`` forms, and the option strings that are not literals."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}
        self.no_value: set[str] = set()
        self.aliases: dict[str, str] = {}
        self.negations: dict[str, str] = {}
        self.unread: list[str] = []

    def add(self, strings: list[str], no_value: bool, negatable: bool) -> None:
        longs = [s[2:] for s in strings if s.startswith("--") and len(s) > 2]
        longs = [s for s in longs if s not in _HELP]
        if not longs:
            return
        primary = longs[0]
        for s in longs:
            if s in self.names:
                continue  # argparse would refuse a second registration: keep the first
            self.names[s] = None
            if no_value:
                self.no_value.add(s)
            if s != primary:
                self.aliases[s] = primary
            if negatable:
                neg = f"no-{s}"
                self.names[neg] = None
                self.no_value.add(neg)
                self.negations[neg] = s


def add_argument_calls(ctx: Context, mod: SourceModule, out: Collector) -> None:
    """Every ``<x>.add_argument(...)`` call of the module: its literal ``--`` option strings."""
    for node in ast.walk(mod.tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        strings = []
        for arg in node.args:
            text = _const_str(arg)
            if text is None:
                out.unread.append(ast.unparse(arg))
            elif text.startswith("-"):
                strings.append(text)
        no_value, negatable = _action(ctx, mod, _keyword(node, "action"), _keyword(node, "nargs"))
        out.add(strings, no_value, negatable)


def _is_annotated(expr: ast.expr) -> bool:
    return _last(expr) in ("A", "Annotated")


def _unwrap_optional(expr: ast.expr) -> ast.expr:
    """``X`` of ``Optional[X]``, ``Union[X, None]``, ``X | None``; else ``expr`` (arg_utils._unwrap_optional)."""
    parts: list[ast.expr] | None = None
    if isinstance(expr, ast.Subscript) and _last(expr.value) == "Optional":
        return expr.slice
    if isinstance(expr, ast.Subscript) and _last(expr.value) == "Union":
        parts = list(expr.slice.elts) if isinstance(expr.slice, ast.Tuple) else [expr.slice]
    elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        parts = []
        stack: list[ast.expr] = [expr]
        while stack:
            e = stack.pop()
            if isinstance(e, ast.BinOp) and isinstance(e.op, ast.BitOr):
                stack += [e.right, e.left]
            else:
                parts.append(e)
    if parts is None:
        return expr
    rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None) and _dotted(p) != "NoneType"]
    return rest[0] if len(rest) == 1 else expr


def field_option(ctx: Context, mod: SourceModule, stmt: ast.AnnAssign, out: Collector) -> None:
    """The option ``add_cli_args_from_dataclass`` registers for one annotated field, if any."""
    if not isinstance(stmt.target, ast.Name):
        return
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and _is_annotated(ann.value) and isinstance(ann.slice, ast.Tuple)):
        return  # plain annotation (ClassVar included): no option
    inner, *metadata = ann.slice.elts
    meta: ast.Call | None = None
    for m in metadata:  # the first Arg(...) or string wins (arg_utils._unwrap_annotated)
        if isinstance(m, ast.Call) and _last(m.func) == "Arg":
            meta = m
            break
        if _const_str(m) is not None or isinstance(m, ast.JoinedStr):
            meta = ast.Call(func=ast.Name("Arg"), args=[], keywords=[])
            break
    if meta is None:
        return
    no_cli = _keyword(meta, "no_cli")
    if isinstance(no_cli, ast.Constant) and no_cli.value is True:
        return
    name = stmt.target.id
    cli = _const_str(_keyword(meta, "cli_name")) or "--" + name.replace("_", "-")
    strings = [cli]
    aliases = _keyword(meta, "aliases")
    if isinstance(aliases, (ast.List, ast.Tuple)):
        for a in aliases.elts:
            text = _const_str(a)
            if text is None:
                out.unread.append(ast.unparse(a))
            else:
                strings.append(text)
    action = _keyword(meta, "action")
    if action is not None:
        nargs = None
        kwargs = _keyword(meta, "action_kwargs")
        if isinstance(kwargs, ast.Dict):
            for k, v in zip(kwargs.keys, kwargs.values):
                if _const_str(k) == "nargs":
                    nargs = v
        no_value, negatable = _action(ctx, mod, action, nargs)
    else:
        no_value, negatable = _last(_unwrap_optional(inner)) == "bool", False
    out.add(strings, no_value, negatable)


def field_classes(ctx: Context, mod: SourceModule, server_args: ast.ClassDef) -> list[tuple[SourceModule, ast.ClassDef]]:
    """``ServerArgs`` itself, then the namespace classes given to ``collect_input_fields(...)`` (0.5.21+)."""
    out = [(mod, server_args)]
    for node in ast.walk(mod.tree):
        if not (isinstance(node, ast.Call) and _last(node.func) == "collect_input_fields" and node.args):
            continue
        arg = node.args[0]
        elts = list(arg.elts) if isinstance(arg, (ast.List, ast.Tuple)) else (
            mod.lists.get(arg.id, []) if isinstance(arg, ast.Name) else [])
        for e in elts:
            found = ctx.resolve_class(mod, e)
            if found is not None and found not in out:
                out.append(found)
    return out
