"""Which launch flags a release's sglang server accepts, read from its source (``ServerFlags``).

Pure: source text in, values out. Nothing here imports sglang, reads a file or touches a host; the caller reads the
files (``resolve_server_flags`` takes a function that does) and passes their text.

- ``parse_server_flags(source, modules)``: from the text of a release's ``sglang/srt/server_args.py`` (and of the
  ``sglang.srt.arg_groups`` modules it names in ``ServerFlags.missing``), the long options of the server's argparse
  parser (``ServerFlags``): their names without ``--``, which take no value, which are other spellings of which.
- ``resolve_server_flags(read)``: the same, reading ``server_args.py`` and then each module it needs through
  ``read(relative_path)``, until nothing is missing.

The syntax trees are read by ``flags_ast``; which EAGLE shapes sglang refuses is ``eagle_limits``.

How sglang builds its parser, per release (``prepare_server_args`` -> ``ServerArgs.add_cli_args(parser)``):

- up to 0.5.12: explicit ``parser.add_argument("--model-path", "--model", type=str, ...)`` calls; the first option
  string is argparse's primary one (its dest), the others are aliases.
- 0.5.16: ``add_cli_args_from_dataclass(parser, ServerArgs)`` (``sglang/srt/arg_groups/arg_utils.py``) turns every
  field of the ``ServerArgs`` dataclass annotated ``A[T, "help"]`` or ``A[T, Arg(...)]`` into an option, then a few
  explicit ``add_argument`` calls follow (deprecated spellings, dynamic choices, ``--config``).
- 0.5.21+: the same, but the fields live in namespace classes (``msgspec.Struct``) of
  ``sglang/srt/arg_groups/fields/*.py``, listed in server_args.py's ``collect_input_fields(_INPUT_NAMESPACES)``.

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

from eaglepatch.server.flags_ast import (
    Collector,
    Context,
    SourceModule,
    add_argument_calls,
    field_classes,
    field_option,
    load_module,
)

SERVER_ARGS_MODULE = "sglang.srt.server_args"
SERVER_ARGS_PATH = "sglang/srt/server_args.py"


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
    main = load_module(SERVER_ARGS_MODULE, source)
    if main is None or "ServerArgs" not in main.classes:
        return None
    loaded: dict[str, SourceModule] = {SERVER_ARGS_MODULE: main}
    for name, text in (modules or {}).items():
        if name != SERVER_ARGS_MODULE:
            m = load_module(name, text)
            if m is not None:
                loaded[name] = m
    ctx = Context(loaded)
    out = Collector()
    classes = field_classes(ctx, main, main.classes["ServerArgs"])
    fields = 0
    for mod, cls in classes:
        # A field annotated twice in one class body (0.5.16's dcp_size) is one field: the last annotation wins.
        stmts: dict[str, ast.AnnAssign] = {}
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                stmts[stmt.target.id] = stmt
        for stmt in stmts.values():
            before = len(out.names)
            field_option(ctx, mod, stmt, out)
            fields += len(out.names) > before
    add_argument_calls(ctx, main, out)
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
