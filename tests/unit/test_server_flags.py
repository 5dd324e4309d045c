"""eaglepatch.server.flags (and flags_ast) on small hand-written server_args.py sources of each style (explicit
add_argument calls; an ``A[...]`` dataclass; namespace classes in other modules), the suggestion, and
check_speculative_point (eaglepatch.server.eagle_limits)."""

from __future__ import annotations

import textwrap

import pytest

from eaglepatch.server.eagle_limits import check_speculative_point, draft_tree_candidates
from eaglepatch.server.flags import ServerFlags, module_path, parse_server_flags, resolve_server_flags

OLD_STYLE = textwrap.dedent('''
    import argparse
    import dataclasses

    @dataclasses.dataclass
    class ServerArgs:
        model_path: str
        tp_size: int = 1
        disable_cuda_graph: bool = False

        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser):
            parser.add_argument("--model-path", "--model", type=str, required=True)
            parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
            parser.add_argument("--disable-cuda-graph", action="store_true")
            parser.add_argument("--enable-thing", action="store_false")
            parser.add_argument("--speculative-num-steps", type=int)
            parser.add_argument("--trust-remote-code", type=bool)
            parser.add_argument("--old-flag", action=DeprecatedAction, help="gone")
            parser.add_argument("--lora-paths", action=LoRAPathAction, nargs="*")
            parser.add_argument("--use-x", action=argparse.BooleanOptionalAction)
            parser.add_argument("--stored-const", action=DeprecatedAction, nargs=1)
            for kind in ("a", "b"):
                parser.add_argument(f"--{kind}-backend", type=str)


    class LoRAPathAction(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, self.dest, values)


    class DeprecatedAction(argparse.Action):
        def __init__(self, option_strings, dest, nargs=0, **kwargs):
            super().__init__(option_strings, dest, nargs=nargs, **kwargs)
''')

DATACLASS_STYLE = textwrap.dedent('''
    from __future__ import annotations
    import argparse
    import dataclasses
    from typing import List, Literal, Optional
    from sglang.srt.arg_groups.arg_utils import A, Arg, add_cli_args_from_dataclass
    from sglang.srt.arg_groups.argparse_actions import DeprecatedStoreTrueAction

    @dataclasses.dataclass
    class ServerArgs:
        """Docstring with an example that is no field: host: A[str, "x"] = "127.0.0.1"."""

        model_path: A[str, Arg(help="The model.", aliases=["--model"])]
        tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
        port: A[int, "The port."] = 30000
        trust_remote_code: A[bool, "Allow custom code."] = False
        enable_x: A[Optional[bool], "Optional bool: still store_true."] = None
        enable_y: A[bool | None, "Union with None written with |."] = None
        load_format: A[Literal["auto", "pt"], "Literal: takes a value."] = "auto"
        cuda_graph_bs: A[Optional[List[int]], "A list: takes values."] = None
        fp8_gemm_runner_backend: A[str, Arg(help="Renamed.", cli_name="--fp8-gemm-backend")] = "auto"
        dllm_fdfo: A[bool, Arg(help="Negatable.", action=argparse.BooleanOptionalAction)] = True
        disable_cuda_graph: A[bool, Arg(no_cli=True)] = False
        _explicitly_set: A[bool, Arg(no_cli=True)] = False
        reasoning_parser: Optional[str] = None
        dcp_size: A[int, "Declared twice: the last one counts."] = 1
        dcp_size: A[bool, Arg(help="The last one.", aliases=["--dcp"])] = False
        stat_loggers: A[Optional[dict], NS("observability")] = None

        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser):
            add_cli_args_from_dataclass(parser, ServerArgs)
            parser.add_argument("--reasoning-parser", type=str)
            parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction, new_flag="--x")
            parser.add_argument("--config", type=str)
''')

ACTIONS_MODULE = textwrap.dedent('''
    import argparse

    class DeprecatedStoreTrueAction(argparse.Action):
        def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
            super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    class DeprecatedAliasStoreAction(argparse.Action):
        def __init__(self, option_strings, dest, new_flag=None, **kwargs):
            super().__init__(option_strings, dest, **kwargs)
''')

NAMESPACE_STYLE = textwrap.dedent('''
    from __future__ import annotations
    import argparse
    from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass
    from sglang.srt.arg_groups.argparse_actions import DeprecatedStoreTrueAction
    from sglang.srt.arg_groups.fields import collect_input_fields
    from sglang.srt.arg_groups.fields.spec import Spec
    from .arg_groups.fields.parallel import Parallel

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser):
            add_cli_args_from_dataclass(parser, ServerArgs)
            parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction)

    _INPUT_NAMESPACES = [Spec, Parallel]
    _annotations, _defaults, _namespaces = collect_input_fields(_INPUT_NAMESPACES)
''')

SPEC_FIELDS = textwrap.dedent('''
    from typing import Optional
    import msgspec
    from sglang.srt.arg_groups.arg_utils import A, Arg
    from sglang.srt.arg_groups.argparse_actions import DeprecatedAliasStoreAction

    class Spec(msgspec.Struct):
        _NS_PATH = "spec"
        speculative_num_steps: A[Optional[int], "Steps."] = None
        speculative_draft_model_path: A[Optional[str], Arg(help="Draft.", aliases=["--speculative-draft-model"])] = None
        speculative_old: A[Optional[int], Arg(help="Old.", action=DeprecatedAliasStoreAction)] = None
        _explicitly_set: A[bool, Arg(no_cli=True)] = False
''')

PARALLEL_FIELDS = textwrap.dedent('''
    import msgspec
    from sglang.srt.arg_groups.arg_utils import A, Arg

    class Parallel(msgspec.Struct):
        _NS_PATH = "parallel"
        tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
        enable_dp_attention: A[bool, "DP attention."] = False
''')

NAMESPACE_MODULES = {
    "sglang.srt.arg_groups.fields.spec": SPEC_FIELDS,
    "sglang.srt.arg_groups.fields.parallel": PARALLEL_FIELDS,
    "sglang.srt.arg_groups.argparse_actions": ACTIONS_MODULE,
}


# ----------------------------------------------------------------------------------------------------------------
# Explicit add_argument calls (0.4.x - 0.5.12)


def test_add_argument_style_names_and_aliases():
    """Every literal ``--`` string of an add_argument call is an option; the first of a call is argparse's primary
    spelling (its dest), the others alias it."""
    flags = parse_server_flags(OLD_STYLE)
    assert flags is not None and flags.complete and flags.style == "add_argument"
    for name in ("model-path", "model", "tensor-parallel-size", "tp-size", "disable-cuda-graph",
                 "speculative-num-steps", "trust-remote-code", "old-flag", "lora-paths", "use-x", "no-use-x"):
        assert name in flags, name
    assert flags.aliases == {"model": "model-path", "tp-size": "tensor-parallel-size"}
    assert flags.canonical("--tp-size") == "tensor-parallel-size"
    assert flags.canonical("port") == "port"
    assert "help" not in flags and "speculative-num-stepz" not in flags


def test_add_argument_style_value_less_flags():
    """store_true/store_false, an Action subclass whose __init__ defaults nargs to 0, and BooleanOptionalAction (with
    its --no- form) take no value; type=bool, nargs='*' and an explicit nargs=1 do."""
    flags = parse_server_flags(OLD_STYLE)
    assert flags is not None
    assert flags.no_value == {"disable-cuda-graph", "enable-thing", "old-flag", "use-x", "no-use-x"}
    assert flags.negations == {"no-use-x": "use-x"}
    assert flags.takes_value("trust-remote-code") and not flags.takes_value("--disable-cuda-graph")


def test_add_argument_style_reports_what_it_cannot_read():
    """An option string built at run time (an f-string in a loop) is not guessed: it is listed in ``unread``."""
    flags = parse_server_flags(OLD_STYLE)
    assert flags is not None
    assert flags.unread == ("f'--{kind}-backend'",)
    assert not any(n.endswith("-backend") for n in flags.names)


def test_an_action_class_named_through_its_module():
    """``action=aa.DeprecatedAction`` after ``import sglang...argparse_actions as aa`` is looked up in that module."""
    source = textwrap.dedent('''
        import sglang.srt.arg_groups.argparse_actions as aa
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--old", action=aa.DeprecatedStoreTrueAction)
                parser.add_argument("--renamed", action=aa.DeprecatedAliasStoreAction)
    ''')
    first = parse_server_flags(source)
    assert first is not None and first.missing == ("sglang.srt.arg_groups.argparse_actions",)
    flags = parse_server_flags(source, {"sglang.srt.arg_groups.argparse_actions": ACTIONS_MODULE})
    assert flags is not None and flags.complete
    assert flags.names == {"old", "renamed"} and flags.no_value == {"old"}


# ----------------------------------------------------------------------------------------------------------------
# The A[...] dataclass (0.5.16)


def test_dataclass_style_fields_become_options():
    """Each field annotated A[T, "help"] or A[T, Arg(...)] is --field-name (or Arg's cli_name) plus its aliases,
    as add_cli_args_from_dataclass registers it; the explicit add_argument calls come on top."""
    flags = parse_server_flags(DATACLASS_STYLE, {"sglang.srt.arg_groups.argparse_actions": ACTIONS_MODULE})
    assert flags is not None and flags.complete and flags.style == "dataclass"
    assert flags.names == {
        "model-path", "model", "tp-size", "tensor-parallel-size", "port", "trust-remote-code", "enable-x",
        "enable-y", "load-format", "cuda-graph-bs", "fp8-gemm-backend", "dllm-fdfo", "no-dllm-fdfo",
        "dcp-size", "dcp", "reasoning-parser", "disable-cuda-graph", "config",
    }
    assert flags.aliases == {"model": "model-path", "tensor-parallel-size": "tp-size", "dcp": "dcp-size"}


def test_dataclass_style_what_is_not_an_option():
    """Not options: a field with Arg(no_cli=True) (the underscore one too), a plain annotation, an A[...] whose
    metadata is neither a string nor an Arg, the help text's example, and a field's default name when cli_name
    renames it."""
    flags = parse_server_flags(DATACLASS_STYLE, {"sglang.srt.arg_groups.argparse_actions": ACTIONS_MODULE})
    assert flags is not None
    for name in ("-explicitly-set", "explicitly-set", "stat-loggers", "host", "fp8-gemm-runner-backend"):
        assert name not in flags, name
    # disable-cuda-graph is the field's no_cli twin, registered by the explicit deprecated call
    assert "disable-cuda-graph" in flags.no_value


def test_dataclass_style_value_less_flags():
    """bool, Optional[bool] and ``bool | None`` fields are store_true; BooleanOptionalAction adds --no-x; a field
    declared twice takes its last type (bool here); Literal and list fields, and the rest, take values."""
    flags = parse_server_flags(DATACLASS_STYLE, {"sglang.srt.arg_groups.argparse_actions": ACTIONS_MODULE})
    assert flags is not None
    assert flags.no_value == {"trust-remote-code", "enable-x", "enable-y", "dllm-fdfo", "no-dllm-fdfo", "dcp-size",
                              "dcp", "disable-cuda-graph"}


def test_an_imported_action_class_is_asked_for():
    """Without argparse_actions' source the parse cannot know that DeprecatedStoreTrueAction takes no value: it
    says which module it misses, and the option is counted as taking one."""
    flags = parse_server_flags(DATACLASS_STYLE)
    assert flags is not None and not flags.complete
    assert flags.missing == ("sglang.srt.arg_groups.argparse_actions",)
    assert "disable-cuda-graph" in flags and flags.takes_value("disable-cuda-graph")


# ----------------------------------------------------------------------------------------------------------------
# Namespace classes in other modules (0.5.21+)


def test_namespace_style_needs_the_field_modules():
    """server_args.py alone names the field modules (and the actions' module) it needs, relative imports resolved;
    given them, the fields are options."""
    first = parse_server_flags(NAMESPACE_STYLE)
    assert first is not None and not first.complete
    assert set(first.missing) == {"sglang.srt.arg_groups.fields.spec", "sglang.srt.arg_groups.fields.parallel",
                                  "sglang.srt.arg_groups.argparse_actions"}
    assert first.names == {"disable-cuda-graph"}
    flags = parse_server_flags(NAMESPACE_STYLE, NAMESPACE_MODULES)
    assert flags is not None and flags.complete and flags.style == "namespaces"
    assert flags.names == {"speculative-num-steps", "speculative-draft-model-path", "speculative-draft-model",
                           "speculative-old", "tp-size", "tensor-parallel-size", "enable-dp-attention",
                           "disable-cuda-graph"}
    assert flags.no_value == {"enable-dp-attention", "disable-cuda-graph"}
    assert flags.aliases == {"speculative-draft-model": "speculative-draft-model-path",
                             "tensor-parallel-size": "tp-size"}


def test_resolve_reads_server_args_then_what_it_misses():
    """resolve_server_flags reads server_args.py, then each missing module by its path, and stops when nothing is
    missing; a module that cannot be read stays in ``missing``."""
    files = {"sglang/srt/server_args.py": NAMESPACE_STYLE}
    files.update({module_path(k): v for k, v in NAMESPACE_MODULES.items()})
    asked: list[str] = []

    def read(path: str) -> str | None:
        asked.append(path)
        return files.get(path)

    flags = resolve_server_flags(read)
    assert flags is not None and flags.complete and "speculative-num-steps" in flags
    assert asked[0] == "sglang/srt/server_args.py" and len(asked) == len(set(asked)) == 4
    del files["sglang/srt/arg_groups/fields/spec.py"]
    partial = resolve_server_flags(files.get)
    assert partial is not None and partial.missing == ("sglang.srt.arg_groups.fields.spec",)
    assert "tp-size" in partial and "speculative-num-steps" not in partial
    assert resolve_server_flags(lambda path: None) is None


@pytest.mark.parametrize("source", [
    "",
    "not python at all (",
    "\x00",
    "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--x')\n",
    "class ServerArgs:\n    pass\n",
    "class Other:\n    x: A[int, 'help'] = 1\n",
])
def test_not_a_server_args_file(source):
    """Text that is not Python, has no top-level ServerArgs class, or declares no option at all gives None (the
    caller keeps its own list)."""
    assert parse_server_flags(source) is None


# ----------------------------------------------------------------------------------------------------------------
# The suggestion


def _flags() -> ServerFlags:
    flags = parse_server_flags(NAMESPACE_STYLE, NAMESPACE_MODULES)
    assert flags is not None
    return flags


@pytest.mark.parametrize("typed,expected", [
    ("speculative-num-stepz", "speculative-num-steps"),
    ("--speculative-num-step", "speculative-num-steps"),
    ("speculative_num_steps", "speculative-num-steps"),
    ("tensor-paralel-size", "tensor-parallel-size"),
    ("speculative-num-steps", None),
    ("frobnicate", None),
])
def test_suggest(typed, expected):
    """The closest known option for a misspelling (one letter off, a letter missing, underscores), none for a known
    name or for one like no option."""
    assert _flags().suggest(typed) == expected


# ----------------------------------------------------------------------------------------------------------------
# check_speculative_point


def _point(steps=None, topk=None, draft=None, **more):
    out = {k.replace("_", "-"): v for k, v in more.items()}
    for name, value in (("speculative-num-steps", steps), ("speculative-eagle-topk", topk),
                        ("speculative-num-draft-tokens", draft)):
        if value is not None:
            out[name] = value
    return out


def test_candidates_formula():
    """topk at the first step, topk*topk at each later one (select_top_k_tokens' tree_info shapes)."""
    assert draft_tree_candidates(1, 4) == 4
    assert draft_tree_candidates(3, 4) == 4 + 2 * 16
    assert draft_tree_candidates(5, 1) == 5


@pytest.mark.parametrize("steps,topk,draft", [
    ("3", "4", "16"),
    ("3", "4", "37"),
    ("1", "4", "5"),
    ("5", "8", "64"),
])
def test_a_tree_that_fits_is_accepted(steps, topk, draft):
    """draft - 1 <= topk + (steps-1)*topk*topk: torch.topk(score_list, draft - 1) has enough candidates (37 is the
    exact limit for 3 steps of top-k 4)."""
    assert check_speculative_point(_point(steps, topk, draft)) is None


@pytest.mark.parametrize("steps,topk,draft,numbers", [
    ("3", "4", "38", ["38", "4 + (3-1)*4*4 = 36", "1 + 36 = 37"]),
    ("1", "4", "6", ["6", "4 + (1-1)*4*4 = 4", "1 + 4 = 5"]),
    ("2", "2", "64", ["64", "2 + (2-1)*2*2 = 6", "1 + 6 = 7"]),
])
def test_too_many_draft_tokens_for_the_tree(steps, topk, draft, numbers):
    """One more draft token than 1 + candidates makes torch.topk ask for more than the tree holds: refused, and the
    reason shows the arithmetic."""
    reason = check_speculative_point(_point(steps, topk, draft))
    assert reason is not None and "\n" not in reason
    for text in numbers:
        assert text in reason
    assert "--speculative-num-draft-tokens" in reason


def test_top_k_one_adjusts_draft_tokens_instead_of_refusing():
    """With top-k 1 sglang sets draft tokens to steps + 1 with a warning, whatever was given (even 0 or 999)."""
    for draft in ("999", "0", "2", None):
        assert check_speculative_point(_point("3", "1", draft)) is None


@pytest.mark.parametrize("point,flag", [
    (_point("2.5", "1"), "--speculative-num-steps '2.5'"),
    (_point("3", "four", "8"), "--speculative-eagle-topk 'four'"),
    (_point("3", "4", ""), "--speculative-num-draft-tokens ''"),
])
def test_non_integers_are_refused_by_argparse(point, flag):
    """The three are type=int in every release: argparse exits at start on anything int() does not read."""
    reason = check_speculative_point(point)
    assert reason is not None and flag in reason and "integer" in reason


@pytest.mark.parametrize("point,flag", [
    (_point("0", "1"), "--speculative-num-steps 0"),
    (_point("-2", "4", "8"), "--speculative-num-steps -2"),
    (_point("3", "0", "8"), "--speculative-eagle-topk 0"),
    (_point("3", "4", "0"), "--speculative-num-draft-tokens 0"),
])
def test_non_positive_values_are_refused(point, flag):
    """No draft step, a tree of width 0, or torch.topk of a negative count cannot run."""
    reason = check_speculative_point(point)
    assert reason is not None and flag in reason


def test_top_k_or_draft_tokens_without_steps_are_refused():
    """Without steps sglang auto-chooses all three and asserts neither of the other two was given."""
    reason = check_speculative_point(_point(topk="4"))
    assert reason is not None and "--speculative-eagle-topk 4" in reason and "--speculative-num-steps" in reason
    assert check_speculative_point(_point(draft="8")) is not None
    assert check_speculative_point(_point()) is None  # all chosen by sglang


def test_steps_without_top_k_are_refused_unless_adaptive():
    """sglang picks no top-k when steps are given (its `topk > 1` comparison fails on None); --speculative-adaptive
    sets top-k 1 itself."""
    reason = check_speculative_point(_point("3"))
    assert reason is not None and "--speculative-eagle-topk" in reason
    assert check_speculative_point(_point("3", speculative_adaptive="on")) is None


def test_a_tree_without_draft_tokens_is_refused():
    """Only top-k 1 fills the draft tokens in; a tree (top-k > 1) without them has no size."""
    reason = check_speculative_point(_point("3", "4"))
    assert reason is not None and "--speculative-num-draft-tokens" in reason


def test_other_algorithms_are_not_checked():
    """NGRAM (and DFLASH, ...) set top-k and draft tokens themselves: EAGLE's rules do not apply."""
    assert check_speculative_point(_point("3", "4", "999", speculative_algorithm="NGRAM")) is None
    assert check_speculative_point(_point("3", "4", "999", speculative_algorithm="eagle3")) is not None


def test_top_k_limits_of_backends_and_rejection_sampling():
    """trtllm_mha and rejection sampling allow only top-k 1 (ValueError at start)."""
    assert "trtllm_mha" in (check_speculative_point(_point("3", "4", "8", decode_attention_backend="trtllm_mha"))
                            or "")
    assert check_speculative_point(_point("3", "1", "4", attention_backend="trtllm_mha")) is None
    reason = check_speculative_point(_point("3", "2", "4", speculative_use_rejection_sampling="on"))
    assert reason is not None and "rejection" in reason
    assert check_speculative_point(_point("3", "2", "4", speculative_use_rejection_sampling="off")) is None
