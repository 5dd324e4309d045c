"""Stand-in for sglang's console script, ``sglang = sglang.cli.main:main`` (standard library only).

As in sglang 0.5.16: ``sglang serve [MODEL] ARGS`` runs the server with ARGS (a first argument that is not a flag
reads as ``--model-path MODEL``); here the server is the stand-in's ``launch_server.main``, in this process, as
sglang's ``serve`` runs its server in the process of the command. ``sglang version`` prints the version.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang")
    sub = parser.add_subparsers(dest="subcommand", required=True)
    sub.add_parser("serve", help="Launch an SGLang server (the stand-in).", add_help=False)
    sub.add_parser("version", help="Show the version information.")
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.subcommand == "version":
        from sglang.version import __version__

        print(f"sglang version: {__version__}")
        return 0
    if extra and not extra[0].startswith("-"):
        extra = ["--model-path", extra[0], *extra[1:]]
    from sglang.launch_server import main as serve

    return serve(extra)


if __name__ == "__main__":
    sys.exit(main())
