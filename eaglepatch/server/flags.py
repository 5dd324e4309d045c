"""Which launch flags a release's sglang server accepts, read from its source; and which EAGLE draft shapes it refuses.

Pure: source text in, values out. Nothing here imports sglang, reads a file or touches a host; the caller reads the
files (``resolve_server_flags`` takes a function that does) and passes their text.

- ``parse_server_flags(source, modules)``: from the text of a release's ``sglang/srt/server_args.py`` (and of the
  ``sglang.srt.arg_groups`` modules it names in ``ServerFlags.missing``), the long options of the server's argparse
  parser (``ServerFlags``): their names without ``--``, which take no value, which are other spellings of which.
- ``resolve_server_flags(read)``: the same, reading ``server_args.py`` and then each module it needs through
  ``read(relative_path)``, until nothing is missing.
- ``check_speculative_point(flags)``: why sglang would refuse (or crash on) the EAGLE speculative flags a sweep point
  would launch with, as one line naming the numbers; None when it would start.

How sglang builds its parser, per release (``prepare_server_args`` -> ``ServerArgs.add_cli_args(parser)``):

- up to 0.5.12: explicit ``parser.add_argument("--model-path", "--model", type=str, ...)`` calls; the first option
  string is argparse's primary one (its dest), the others are aliases.
- 0.5.16: ``add_cli_args_from_dataclass(parser, ServerArgs)`` (``sglang/srt/arg_groups/arg_utils.py``) turns every
  field of the ``ServerArgs`` dataclass annotated ``A[T, "help"]`` or ``A[T, Arg(...)]`` into an option, then a few
  explicit ``add_argument`` calls follow (deprecated spellings, dynamic choices, ``--config``).
- 0.5.21+: the same, but the fields live in namespace classes (``msgspec.Struct``) of
  ``sglang/srt/arg_groups/fields/*.py``, listed in server_args.py's ``collect_input_fields(_INPUT_NAMESPACES)``.

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

What the parse misses (none of it occurs in the pinned releases): option strings built at run time (an f-string, a
name, a loop) rather than written as literals (listed in ``ServerFlags.unread``); fields inherited from a base class;
metadata held in a variable or built by an expression (``A[int, HELP]``, ``A[int, "a" + b]``); options registered
outside server_args.py's ``add_argument`` calls and the field classes.
argparse's own ``--help`` is left out. argparse also accepts any unambiguous prefix of an option
(``--speculative-num-step``); ``ServerFlags`` knows only the full names, which is what a sweep should write.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from types import MappingProxyType
from typing import Callable, Mapping

SERVER_ARGS_MODULE = "sglang.srt.server_args"
SERVER_ARGS_PATH = "sglang/srt/server_args.py"

# argparse's own actions that consume no argument (argparse.py: _StoreTrueAction ... nargs=0).
_NO_VALUE_ACTIONS = frozenset({"store_true", "store_false", "store_const", "append_const", "count", "help", "version"})
_NO_VALUE_ACTION_CLASSES = frozenset({
    "_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction", "_AppendConstAction", "_CountAction",
    "_HelpAction", "_VersionAction", "BooleanOptionalAction",
})
_HELP = frozenset({"help"})


# ----------------------------------------------------------------------------------------------------------------
# The result


@dataclasses.dataclass(frozen=True)
class ServerFlags:
    """The long options of one release's server parser, without their leading ``--``.

    ``names``: every option string the parser accepts (aliases and ``no-x`` forms included, ``help`` left out).
    ``no_value``: those that take no value (store_true and the like). ``aliases``: other spelling -> the primary
    spelling of the same option (argparse's first option string; a dataclass field's own name). ``negations``:
    ``no-x`` -> ``x`` for ``argparse.BooleanOptionalAction`` options. ``style``: how the release builds the parser
    (``"add_argument"``, ``"dataclass"``: fields of ``ServerArgs``, ``"namespaces"``: fields of namespace classes).
    ``missing``: dotted names of modules the parse needed and was not given; a result with any is incomplete.
    ``unread``: the source text of option strings that are not literals, so not counted.
    """

    names: frozenset[str]
    no_value: frozenset[str]
    aliases: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}), hash=False)
    negations: Mapping[str, str] = dataclasses.field(default_factory=lambda: MappingProxyType({}), hash=False)
    style: str = "add_argument"
    missing: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True when no module the parse needed was missing."""
        return not self.missing

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _bare(name) in self.names

    def __len__(self) -> int:
        return len(self.names)

    def canonical(self, name: str) -> str:
        """The primary spelling of ``name`` (``name`` itself, without ``--``, when it is one or is unknown)."""
        name = _bare(name)
        return self.aliases.get(name, name)

    def takes_value(self, name: str) -> bool:
        """False for a known option that takes no value; True otherwise (unknown names included)."""
        return _bare(name) not in self.no_value

    def suggest(self, name: str) -> str | None:
        """The known option closest to a misspelt ``name`` (without ``--``), for a "did you mean" message; None when
        ``name`` is known or nothing is close. Underscores count as dashes (``speculative_num_steps``)."""
        bare = _bare(name)
        if bare in self.names:
            return None
        dashed = bare.replace("_", "-").lower()
        if dashed in self.names:
            return dashed
        close = difflib.get_close_matches(dashed, sorted(self.names), n=1, cutoff=0.75)
        return close[0] if close else None


def _bare(name: str) -> str:
    return name[2:] if name.startswith("--") else name


# ----------------------------------------------------------------------------------------------------------------
# One module's view: its imports, its classes, its module-level lists


@dataclasses.dataclass(frozen=True)
class _Module:
    name: str
    tree: ast.Module
    imports: Mapping[str, tuple[str, str]]  # local name -> (module, name in it); "" for `import x`
    classes: Mapping[str, ast.ClassDef]
    lists: Mapping[str, list[ast.expr]]  # NAME = [a, b] / (a, b) at module level


def _load(name: str, source: str) -> _Module | None:
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
    return _Module(name, tree, MappingProxyType(imports), MappingProxyType(classes), MappingProxyType(lists))


class _Context:
    """The modules known so far, and the ones a lookup found missing."""

    def __init__(self, modules: Mapping[str, _Module]):
        self.modules = modules
        self.missing: list[str] = []

    def need(self, name: str) -> _Module | None:
        mod = self.modules.get(name)
        if mod is None and name not in self.missing:
            self.missing.append(name)
        return mod

    def resolve_class(self, mod: _Module, expr: ast.expr) -> tuple[_Module, ast.ClassDef] | None:
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


def _action_class_no_value(ctx: _Context, mod: _Module, cls: ast.ClassDef, depth: int = 0) -> bool:
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


def _action(ctx: _Context, mod: _Module, action: ast.expr | None, nargs: ast.expr | None) -> tuple[bool, bool]:
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


class _Collector:
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


def _add_argument_calls(ctx: _Context, mod: _Module, out: _Collector) -> None:
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


def _field_option(ctx: _Context, mod: _Module, stmt: ast.AnnAssign, out: _Collector) -> None:
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


def _field_classes(ctx: _Context, mod: _Module, server_args: ast.ClassDef) -> list[tuple[_Module, ast.ClassDef]]:
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


def parse_server_flags(source: str, modules: Mapping[str, str] | None = None) -> ServerFlags | None:
    """The options of the server parser that a release's ``sglang/srt/server_args.py`` (``source``) builds.

    ``modules``: the source of other modules of the release by dotted name (``sglang.srt.arg_groups.fields.spec``,
    read from ``sglang/srt/arg_groups/fields/spec.py``): 0.5.16+ keep their custom argparse actions in
    ``sglang.srt.arg_groups.argparse_actions``, and 0.5.21+ their fields in ``sglang.srt.arg_groups.fields.*``.
    Call once without, then again with the modules the first result names in ``missing``, until it names none
    (``resolve_server_flags`` does that); a result with ``missing`` lacks what those modules define.

    Returns None when ``source`` is not a server_args.py at all (not Python, no top-level ``class ServerArgs``, or not
    one option found while nothing was missing), so that the caller falls back to its own list. Never raises on any
    text; a module in ``modules`` that does not parse counts as missing.
    """
    main = _load(SERVER_ARGS_MODULE, source)
    if main is None or "ServerArgs" not in main.classes:
        return None
    loaded: dict[str, _Module] = {SERVER_ARGS_MODULE: main}
    for name, text in (modules or {}).items():
        if name != SERVER_ARGS_MODULE:
            m = _load(name, text)
            if m is not None:
                loaded[name] = m
    ctx = _Context(loaded)
    out = _Collector()
    classes = _field_classes(ctx, main, main.classes["ServerArgs"])
    fields = 0
    for mod, cls in classes:
        # A field annotated twice in one class body (0.5.16's dcp_size) is one field: the last annotation wins.
        stmts: dict[str, ast.AnnAssign] = {}
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                stmts[stmt.target.id] = stmt
        for stmt in stmts.values():
            before = len(out.names)
            _field_option(ctx, mod, stmt, out)
            fields += len(out.names) > before
    _add_argument_calls(ctx, main, out)
    if not out.names and not ctx.missing:
        return None
    style = "namespaces" if len(classes) > 1 else ("dataclass" if fields else "add_argument")
    return ServerFlags(
        names=frozenset(out.names), no_value=frozenset(out.no_value), aliases=MappingProxyType(dict(out.aliases)),
        negations=MappingProxyType(dict(out.negations)), style=style, missing=tuple(ctx.missing),
        unread=tuple(out.unread),
    )


def module_path(name: str) -> str:
    """The file of a dotted module name, relative to site-packages (``a.b`` -> ``a/b.py``)."""
    return name.replace(".", "/") + ".py"


def resolve_server_flags(read: Callable[[str], str | None], rounds: int = 5) -> ServerFlags | None:
    """``parse_server_flags`` on a release's files, read through ``read(path)`` (a path relative to site-packages,
    e.g. ``sglang/srt/server_args.py``; None when the file is absent): server_args.py first, then each module the
    parse names as missing, until none is or no new one can be read (at most ``rounds`` times).

    Returns what ``parse_server_flags`` returns: None when server_args.py is absent or is not one; a result whose
    ``missing`` is not empty when a module it needs could not be read. Raises what ``read`` raises.
    """
    source = read(SERVER_ARGS_PATH)
    if source is None:
        return None
    modules: dict[str, str] = {}
    absent: set[str] = set()
    flags = parse_server_flags(source, modules)
    for _ in range(rounds):
        if flags is None or not flags.missing:
            break
        wanted = [m for m in flags.missing if m not in modules and m not in absent]
        if not wanted:
            break
        for name in wanted:
            text = read(module_path(name))
            if text is None:
                absent.add(name)
            else:
                modules[name] = text
        flags = parse_server_flags(source, modules)
    return flags


# ----------------------------------------------------------------------------------------------------------------
# Speculative points sglang refuses


_EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")
_ON = ("on", "true", "yes", "1")


def _int(flags: Mapping[str, str], name: str) -> tuple[int | None, str | None]:
    """(value, error) of ``--name`` as argparse's ``type=int`` reads it (Python's ``int(text)``)."""
    text = flags.get(name)
    if text is None:
        return None, None
    try:
        return int(text), None
    except ValueError:
        return None, f"--{name} {text!r} is not an integer: sglang's argparse (type=int) refuses it at start"


def draft_tree_candidates(steps: int, topk: int) -> int:
    """How many draft tokens an EAGLE tree of ``steps`` steps and top-k ``topk`` proposes per request: ``topk`` at
    the first step, then ``topk * topk`` at each later one, of which sglang keeps the best num_draft_tokens - 1."""
    return topk + (steps - 1) * topk * topk


def check_speculative_point(flags: Mapping[str, str]) -> str | None:
    """Why sglang would refuse to run EAGLE speculative decoding with these launch flags, or None when it would run.

    ``flags``: flag name (without ``--``) -> value as written on the command line, for the flags a sweep point would
    launch with (the original command line with the point applied); an absent flag was not given. It reads
    ``speculative-num-steps``, ``speculative-eagle-topk``, ``speculative-num-draft-tokens``, and, where given,
    ``speculative-algorithm`` (only the EAGLE family is checked: EAGLE, EAGLE3, NEXTN, STANDALONE; NGRAM, DFLASH and
    others set these numbers themselves), ``speculative-adaptive``, ``speculative-use-rejection-sampling`` and the
    attention backends. The rules hold in every pinned release (0.4.6 to 0.5.23); see the comments for where sglang
    enforces each. Returns one line naming the flags and numbers; never raises.
    """
    algorithm = flags.get("speculative-algorithm")
    if algorithm is not None and algorithm.upper() not in _EAGLE_FAMILY:
        return None
    # Integers: every release declares the three `type=int` (add_argument up to 0.5.12; an `Optional[int]` field
    # from 0.5.16, which arg_utils._infer_type_func maps to int), so argparse exits at start on anything else.
    values: dict[str, int | None] = {}
    for name in ("speculative-num-steps", "speculative-eagle-topk", "speculative-num-draft-tokens"):
        value, error = _int(flags, name)
        if error:
            return error
        values[name] = value
    steps = values["speculative-num-steps"]
    topk = values["speculative-eagle-topk"]
    draft = values["speculative-num-draft-tokens"]
    adaptive = (flags.get("speculative-adaptive") or "off").lower() in _ON

    # Steps missing: sglang chooses all three itself, and asserts the other two were not given
    # (server_args.py ServerArgs.__post_init__ in 0.4.x, ServerArgs._handle_speculative_decoding 0.5.3-0.5.12,
    # arg_groups/speculative_hook.py _handle_eagle_family 0.5.16+: `assert speculative_eagle_topk is None and
    # speculative_num_draft_tokens is None`); --speculative-adaptive (0.5.16+) picks steps from its config instead.
    if steps is None:
        given = [f"--{n} {flags[n]}" for n in ("speculative-eagle-topk", "speculative-num-draft-tokens")
                 if values[n] is not None]
        if given and not adaptive:
            return (f"{' and '.join(given)} without --speculative-num-steps: sglang chooses all three itself then, "
                    "and asserts at start that none was given")
        return None
    # Non-positive: a draft of no step or a top-k of none builds no tree (the draft loop of EAGLEWorker.draft_forward
    # appends nothing to score_list and torch.cat fails; topk_p.view(-1, topk, topk) fails on 0).
    if steps < 1:
        return f"--speculative-num-steps {steps} must be 1 or more: sglang drafts no token with it and fails"
    if topk is None:
        if adaptive:
            return None  # _init_adaptive_speculative_params: top-k 1, draft tokens = steps + 1
        # Top-k missing: sglang compares it with 1 (`speculative_eagle_topk > 1 and page_size > 1`: TypeError on None
        # in _handle_speculative_decoding 0.5.3-0.5.12 and _handle_eagle_family 0.5.16+; in 0.4.x the EAGLE worker
        # sizes its buffers with it).
        return (f"--speculative-num-steps {steps} without --speculative-eagle-topk: sglang does not choose a top-k "
                "when the steps are given, and fails at start on the missing one (give --speculative-eagle-topk 1 "
                "for a chain)")
    if topk < 1:
        return f"--speculative-eagle-topk {topk} must be 1 or more: sglang cannot draft a tree of width {topk}"
    backends = {flags.get(n) for n in ("attention-backend", "decode-attention-backend", "prefill-attention-backend")}
    if topk > 1 and "trtllm_mha" in backends:
        # _handle_speculative_decoding 0.5.3-0.5.12, _handle_eagle_family 0.5.16+ (trtllm_mha is not a choice before).
        return (f"--speculative-eagle-topk {topk} with the trtllm_mha attention backend: sglang allows only top-k 1 "
                "there (ValueError at start)")
    if topk != 1 and (flags.get("speculative-use-rejection-sampling") or "off").lower() in _ON:
        # speculative_hook.py _handle_eagle_family (0.5.16+, the releases that have the flag).
        return (f"--speculative-eagle-topk {topk} with --speculative-use-rejection-sampling: sglang requires "
                "top-k 1 for rejection sampling (ValueError at start)")
    if topk == 1:
        # Top-k 1 is a chain: every release sets draft tokens to steps + 1 with a warning, never an error
        # (`speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1`).
        return None
    if draft is None:
        # Only top-k 1 fills it in; a tree needs it given (EAGLEWorker passes None on to organize_draft_results /
        # the CUDA graph runners' buffer sizes).
        return (f"--speculative-eagle-topk {topk} without --speculative-num-draft-tokens: sglang fills the draft "
                "tokens in only for top-k 1, and fails at start on the missing value")
    candidates = draft_tree_candidates(steps, topk)
    # The tree: organize_draft_results (speculative/eagle_utils.py, 0.5.6+; build_tree_kernel_efficient_preprocess
    # in speculative/build_eagle_tree.py before) keeps `torch.topk(score_list, num_draft_token - 1)` of the
    # topk + (steps - 1) * topk * topk scores per request (select_top_k_tokens, speculative/spec_utils.py from 0.5.3,
    # eagle_utils.py before: (b, 1, topk) at the first step, (b, topk, topk) at each later one); torch.topk fails
    # when k exceeds them, and on k < 0.
    if draft < 1:
        return (f"--speculative-num-draft-tokens {draft} must be 1 or more: sglang keeps the best "
                f"num_draft_tokens - 1 = {draft - 1} of the draft tree's candidates, and torch.topk fails on it")
    if draft - 1 > candidates:
        return (f"--speculative-num-draft-tokens {draft} is too many for --speculative-num-steps {steps} and "
                f"--speculative-eagle-topk {topk}: the draft tree has {topk} + ({steps}-1)*{topk}*{topk} = "
                f"{candidates} candidates, so at most 1 + {candidates} = {candidates + 1} draft tokens (sglang's "
                f"torch.topk of {draft - 1} among {candidates} fails)")
    return None

