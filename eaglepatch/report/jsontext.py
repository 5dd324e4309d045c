"""A report's JSON text, piece by piece: exactly what ``json.dumps(doc, indent=1) + "\\n"`` gives, without ever
holding the whole document as objects, nor the standard encoder's million small pieces of it.

A report of many runs holds tens of thousands of groups: ``json.dumps(indent=1)`` of the whole document runs
the pure-Python encoder over all of it at once (its pieces, then their join: several times the text's size).
Here the top level is written key by key, and a list at the top level (``groups``, ``runs``) item by item, each
item encoded on its own (``json.dumps(item, indent=1)``, its lines indented one level deeper: a JSON string never
holds a raw newline, so each newline of the item's text is one of its line ends). A list may be ``Items``: a
lazy iterable whose items are made as they are written (a group's dict made, written, and dropped), so that the
document need never exist whole. The pieces (a group's each, in the memory its freed objects leave) are joined
once, or each handed to ``write`` as it is made (``write_indented``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

class Items:
    """A list of the document made as it is written: ``indented`` writes ``items`` one by one, once."""

    __slots__ = ("items",)

    def __init__(self, items: Iterable[Any]):
        self.items = items

    def materialize(self) -> list[Any]:
        """The items as a list (for a reader that needs them all, a chart)."""
        return list(self.items)


def indented(doc: dict[str, Any]) -> str:
    """``json.dumps(doc, indent=1) + "\\n"``, byte for byte, where ``doc``'s values that are ``Items`` stand for
    the lists of their items. ``doc``'s keys are strings."""
    part: list[str] = []
    write_indented(doc, part.append)
    return "".join(part)


def write_indented(doc: dict[str, Any], write: Callable[[str], Any]) -> None:
    """``indented(doc)``, handed to ``write`` piece by piece as each is made (a top-level value, or one item of a
    top-level list): the text never exists whole."""
    dumps = json.dumps
    write("{")
    first = True
    for key, value in doc.items():
        write(("\n " if first else ",\n ") + dumps(key) + ": ")
        first = False
        if isinstance(value, (Items, list)):
            empty = True
            for item in value.items if isinstance(value, Items) else value:
                write(("[\n  " if empty else ",\n  ") + dumps(item, indent=1).replace("\n", "\n  "))
                empty = False
            write("[]" if empty else "\n ]")
        else:
            write(dumps(value, indent=1).replace("\n", "\n "))
    write("}\n" if first else "\n}\n")
