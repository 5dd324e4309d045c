"""The transform's results kept on the client, so that instrumenting a file seen before costs nothing.

``apply`` (and ``diff``, ``status``) instrument every worker file of the target's sglang on the client: libcst,
about 120 ms for one release's files. The same release on another host, or applied again after a revert (a tuning
loop), is the same text, and its result is the same: it is kept in ``$XDG_CACHE_HOME/eaglepatch/transforms``,
one JSON file per result, named by a hash of everything the result depends on: the file's text and path, the
recipe, and the transform's own source files and libcst's version (a changed transform never reads an old
result). A result read back is used only when it holds together: the text it was made from has the same hash,
and an instrumented output, with eaglepatch's lines taken out, is that text with eaglepatch's lines taken out.
Anything else (a missing, unreadable or foreign file) is a miss, and the transform runs. ``MAX_ENTRIES`` files
at most are kept, the oldest removed first. ``EAGLEPATCH_TRANSFORM_CACHE=0`` turns it off.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any

from eaglepatch.cache import cache_root, write_json
from eaglepatch.ops import lazy_engine
from eaglepatch.transform.marks import strip_lines
from eaglepatch.transform.recipe import Recipe
from eaglepatch.transform.results import (
    FactSite,
    Instrumented,
    NotApplicable,
    PhaseSite,
    Refused,
    TransformResult,
    WorkerInfo,
)

MAX_ENTRIES = 64  # about 10 MB at most: a release's files are 6-10 results of up to 130 kB
_FORMAT = 1  # raise when the JSON below changes
_FINGERPRINT: list[str] = []  # the transform's sources and libcst's version, hashed once per process


def _fingerprint() -> str:
    if not _FINGERPRINT:
        h = hashlib.sha256(f"format {_FORMAT}\0".encode())
        folder = pathlib.Path(__file__).resolve().parent.parent / "transform"
        for f in sorted(folder.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        try:
            from importlib.metadata import version

            h.update(version("libcst").encode())
        except Exception:  # noqa: BLE001 - not installed as a distribution: the sources alone
            h.update(b"libcst ?")
        _FINGERPRINT.append(h.hexdigest())
    return _FINGERPRINT[0]


def _key(text: str, path: str, recipe: Recipe) -> str:
    h = hashlib.sha256(_fingerprint().encode())
    for part in (repr(recipe), path, text):
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big") + data)
    return h.hexdigest()


def _folder() -> pathlib.Path:
    return cache_root() / "transforms"


def _text_sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def to_json(res: TransformResult) -> dict[str, Any]:
    """The result as JSON (``from_json`` gives it back equal)."""
    return {"kind": type(res).__name__, **dataclasses.asdict(res)}


def _worker(w: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(**{**w, "phases": tuple(PhaseSite(**p) for p in w["phases"]),
                         "facts": tuple(FactSite(**{**f, "attrs": tuple(f["attrs"])}) for f in w["facts"]),
                         "missing": tuple(w["missing"])})


def from_json(doc: dict[str, Any]) -> TransformResult:
    """A result from ``to_json``'s form; raises (KeyError, TypeError, ValueError) on anything else."""
    d = dict(doc)
    kind = d.pop("kind")
    if kind == "Refused":
        return Refused(**d)
    workers = tuple(_worker(w) for w in d.pop("workers"))
    if kind == "NotApplicable":
        return NotApplicable(workers=workers, **d)
    if kind == "Instrumented":
        return Instrumented(workers=workers, warnings=tuple(d.pop("warnings")), **d)
    raise ValueError(f"not a transform result: {kind!r}")


def _load(key: str, text: str, path: str) -> TransformResult | None:
    try:
        doc = json.loads((_folder() / (key + ".json")).read_text(encoding="utf-8"))
        if doc.get("input_sha256") != _text_sha(text):
            return None
        res = from_json(doc["result"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if res.path != path:
        return None
    if isinstance(res, Instrumented) and strip_lines(res.source) != strip_lines(text):
        return None
    try:
        os.utime(_folder() / (key + ".json"))  # used: the last to go
    except OSError:
        pass
    return res


def _seen(recipe: Recipe) -> pathlib.Path:
    """The mark that this client has kept results of this transform (``_fingerprint``) and ``recipe``."""
    h = hashlib.sha256(f"{_fingerprint()}\0{recipe!r}".encode("utf-8", "surrogatepass")).hexdigest()
    return _folder() / f"seen-{h[:32]}"


def expects_hits(recipe: Recipe) -> bool:
    """Whether an apply is likely to find every result here: this client has kept results of this transform and
    ``recipe`` before (a tuning loop applies one release again and again). Then the transform's import is not
    started ahead of the facts round trip (``lazy_engine.preload_transform``): it is work the client would
    repeat for nothing, and on a loaded client (or a loopback host sharing its cores) it slowed the round trip
    it was meant to hide in (the facts request of an apply over loopback SSH: 389 ms with the import beside it,
    317 ms without, on 2 cores). A release this client has not instrumented then imports it on first use."""
    if os.environ.get("EAGLEPATCH_TRANSFORM_CACHE") == "0":
        return False
    try:
        return _seen(recipe).exists()
    except OSError:
        return False


def _store(key: str, text: str, res: TransformResult, recipe: Recipe) -> None:
    folder = _folder()
    try:
        write_json(folder / (key + ".json"), {"input_sha256": _text_sha(text), "result": to_json(res)})
        _seen(recipe).touch()
        entries = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink()
    except OSError:
        return  # a cache that cannot be written is no cache: the result stands


def instrument(text: str, path: str, recipe: Recipe) -> TransformResult:
    """``engine.instrument(text, path, recipe)``, read from the cache when it holds the result."""
    if os.environ.get("EAGLEPATCH_TRANSFORM_CACHE") == "0":
        return lazy_engine.engine().instrument(text, path, recipe)
    key = _key(text, path, recipe)
    hit = _load(key, text, path)
    if hit is not None:
        return hit
    res = lazy_engine.engine().instrument(text, path, recipe)
    _store(key, text, res, recipe)
    return res
