"""The annotation helpers the stand-in's ``server_args.py`` is written with (the shape of sglang 0.5.16's):
``A`` is ``typing.Annotated``; ``Arg`` carries a flag's help text, aliases and the like."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Optional

A = Annotated


@dataclasses.dataclass(frozen=True)
class Arg:
    help: str = ""
    aliases: Optional[list] = None
    choices: Optional[list] = None
    action: Optional[str] = None
    type_parser: Any = None
