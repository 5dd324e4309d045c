#!/usr/bin/env python3
"""Transform time against libcst's parse time, for the worker files of every pinned sglang release.

For each pinned release (``PINNED`` in tests/sglang_releases.py, fetched into the release cache on first use) and
each of its speculative worker files (``worker_files``: the files defining or inheriting an entry method), times,
interleaved, ``--repeat`` times each after one warm-up of both:

* ``parse_s``: ``libcst.parse_module(source)``, the floor: libcst reading the file and nothing else;
* ``transform_s``: ``eaglepatch.transform.engine.instrument(source, path, builtin_recipe())``, everything the
  transform does to a file (the standard ast's parse of the file, libcst's parse of the methods it scans and their
  position metadata, finding the phase calls, rendering, and the self-check: compile the output and strip it back
  to the input). Files of a worker family the recipe does not instrument
  (``NotApplicable``: DFlash, DSpark, Uno, the inheriting Standalone workers) are still parsed and searched.

``ratio`` is ``median(transform_s) / median(parse_s)``. The headline is the newest release's largest V2 worker
file (issue 2's target: at most 2.5x), timed with ``--headline-repeat`` runs; since the largest V2 file of recent
releases (dflash_worker_v2.py) is one the recipe does not instrument, the largest V2 file it does instrument is a
second headline. Prints one JSON object on stdout.

    python benchmarks/bench_transform.py [--repeat 3] [--headline-repeat 9] [--releases 0.5.16 0.5.23]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)
# The release cache: the same one make sets for the tests (EAGLEPATCH_TEST_CACHE), else <repo>/.cache when it
# holds sites already, else eaglepatch's default (~/.cache/eaglepatch).
if not os.environ.get("EAGLEPATCH_TEST_CACHE") and (ROOT / ".cache" / "sites").is_dir():
    os.environ["EAGLEPATCH_TEST_CACHE"] = str(ROOT / ".cache")

import libcst  # noqa: E402

import sglang_releases  # noqa: E402  (tests/sglang_releases.py: PINNED, release_site, worker_files)
from eaglepatch.transform.engine import instrument  # noqa: E402
from eaglepatch.transform.recipe import builtin_recipe  # noqa: E402

TARGET = 2.5


def _once(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_file(path: Path, rel: str, recipe, repeat: int) -> dict:
    source = path.read_text(encoding="utf-8")
    result = instrument(source, rel, recipe)  # warm-up (and the outcome)
    libcst.parse_module(source)
    parse_t, transform_t = [], []
    for _ in range(repeat):
        parse_t.append(_once(lambda: libcst.parse_module(source)))
        transform_t.append(_once(lambda: instrument(source, rel, recipe)))
    parse_s, transform_s = statistics.median(parse_t), statistics.median(transform_t)
    return {
        "file": rel,
        "bytes": len(source.encode("utf-8")),
        "lines": source.count("\n"),
        "outcome": type(result).__name__,
        "parse_s": round(parse_s, 5),
        "transform_s": round(transform_s, 5),
        "ratio": round(transform_s / parse_s, 3),
        "repeat": repeat,
    }


def run(releases: list[str], repeat: int, headline_repeat: int) -> dict:
    recipe = builtin_recipe()
    rows = []
    per_release = []
    for version in releases:
        files = sglang_releases.worker_files(version)
        spec = sglang_releases.speculative_dir(version)
        got = [measure_file(f, f.relative_to(spec).as_posix(), recipe, repeat) for f in files]
        for g in got:
            g["release"] = version
        rows += got
        p = sum(g["parse_s"] for g in got)
        t = sum(g["transform_s"] for g in got)
        per_release.append({"release": version, "files": len(got), "parse_s": round(p, 4),
                            "transform_s": round(t, 4), "ratio": round(t / p, 3) if p else None})

    newest = releases[-1]
    spec = sglang_releases.speculative_dir(newest)
    v2 = [r for r in rows if r["release"] == newest and r["file"].endswith("_v2.py")]
    headlines = []
    if v2:
        largest = max(v2, key=lambda r: r["bytes"])
        picks = [("largest V2 worker file", largest)]
        inst = [r for r in v2 if r["outcome"] == "Instrumented"]
        if inst:
            largest_inst = max(inst, key=lambda r: r["bytes"])
            if largest_inst is not largest:
                picks.append(("largest V2 worker file the recipe instruments", largest_inst))
        for what, row in picks:
            h = measure_file(spec / row["file"], row["file"], recipe, headline_repeat)
            h.update(release=newest, what=what, target=TARGET, met=h["ratio"] <= TARGET)
            headlines.append(h)
    return {
        "releases": releases,
        "repeat": repeat,
        "headline_repeat": headline_repeat,
        "files": rows,
        "per_release": per_release,
        "headlines": headlines,
        "target": TARGET,
        "libcst": getattr(libcst, "__version__", None) or _dist_version("libcst"),
        "python": sys.version.split()[0],
    }


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", nargs="*", default=None, help="default: every pinned release, oldest first")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--headline-repeat", type=int, default=9)
    args = ap.parse_args(argv)
    releases = args.releases or list(sglang_releases.PINNED)
    res = run(releases, max(1, args.repeat), max(1, args.headline_repeat))
    print(json.dumps(res))
    for h in res["headlines"]:
        print(f"{h['release']} {h['file']} ({h['what']}, {h['outcome']}): transform {h['transform_s'] * 1e3:.1f} ms "
              f"vs parse {h['parse_s'] * 1e3:.1f} ms = {h['ratio']:.2f}x (target <= {TARGET}x: "
              f"{'met' if h['met'] else 'MISSED'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
