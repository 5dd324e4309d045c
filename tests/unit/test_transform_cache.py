"""The transform's results kept on the client (eaglepatch/ops/transform_cache.py), on real worker files: a result
read back equals the transform's, a file seen before is not transformed again, and anything that does not hold
together (another text, a changed output, a foreign file) is a miss."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from eaglepatch.ops import lazy_engine, transform_cache
from eaglepatch.transform.engine import instrument as real_instrument
from eaglepatch.transform.recipe import Recipe
from eaglepatch.transform.results import Instrumented, NotApplicable, Refused

SPEC = "sglang/srt/speculative/"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EAGLEPATCH_TRANSFORM_CACHE", raising=False)
    return tmp_path / "cache" / "eaglepatch" / "transforms"


@pytest.fixture
def calls(monkeypatch):
    """The paths the real transform was run on (through lazy_engine, as the cache runs it)."""
    seen: list[str] = []
    engine = lazy_engine.engine()

    class Spy:
        def __getattr__(self, name):
            return getattr(engine, name)

        @staticmethod
        def instrument(text, path, recipe):
            seen.append(path)
            return real_instrument(text, path, recipe)

    monkeypatch.setattr(lazy_engine, "engine", lambda: Spy())
    return seen


def files(site: Path) -> dict[str, str]:
    return {SPEC + n: (site / SPEC / n).read_text(encoding="utf-8")
            for n in ("eagle_worker_v2.py", "ngram_worker.py", "dflash_worker_v2.py")}


def test_results_survive_json_exactly(sglang_release, recipe):
    """Instrumented (workers, phases, facts, warnings), NotApplicable and Refused come back equal."""
    got = [real_instrument(text, path, recipe) for path, text in files(sglang_release("0.5.16")).items()]
    got.append(real_instrument("def f(:\n", SPEC + "broken.py", recipe))
    assert {type(r) for r in got} == {Instrumented, NotApplicable, Refused}
    assert any(isinstance(r, Instrumented) and r.workers[0].phases and r.workers[0].facts for r in got)
    for r in got:
        assert transform_cache.from_json(json.loads(json.dumps(transform_cache.to_json(r)))) == r


def test_a_file_seen_before_is_not_transformed_again(sglang_release, recipe, cache, calls):
    src = files(sglang_release("0.5.16"))
    first = {p: transform_cache.instrument(t, p, recipe) for p, t in src.items()}
    assert calls == list(src) and len(list(cache.glob("*.json"))) == 3
    again = {p: transform_cache.instrument(t, p, recipe) for p, t in src.items()}
    assert calls == list(src) and again == first == {p: real_instrument(t, p, recipe) for p, t in src.items()}
    # the patched text is another input: transformed (once), to the same output
    path = SPEC + "eagle_worker_v2.py"
    patched = first[path].source
    assert transform_cache.instrument(patched, path, recipe).source == patched
    assert transform_cache.instrument(patched, path, recipe).source == patched
    assert calls.count(path) == 2


def test_what_does_not_hold_together_is_a_miss(sglang_release, recipe, cache, calls):
    path = SPEC + "eagle_worker_v2.py"
    text = files(sglang_release("0.5.16"))[path]
    good = transform_cache.instrument(text, path, recipe)
    (entry,) = cache.glob("*.json")
    doc = json.loads(entry.read_text())
    # an output that is not this text plus eaglepatch's lines
    doc["result"]["source"] = good.source.replace("def forward_batch_generation", "def forward_batch_generatio", 1)
    entry.write_text(json.dumps(doc))
    assert transform_cache.instrument(text, path, recipe) == good and len(calls) == 2
    # the text it says it was made from is another one
    doc = json.loads(entry.read_text())
    doc["input_sha256"] = "0" * 64
    entry.write_text(json.dumps(doc))
    assert transform_cache.instrument(text, path, recipe) == good and len(calls) == 3
    # not a result at all, or not JSON
    for junk in ('{"input_sha256": "x", "result": {"kind": "Nothing"}}', "\x00\x01"):
        entry.write_text(junk)
        assert transform_cache.instrument(text, path, recipe) == good
    assert len(calls) == 5
    # another path, another recipe: another key
    transform_cache.instrument(text, SPEC + "copy.py", recipe)
    other = Recipe(recipe.families[:1], recipe.unsupported, "one family")
    transform_cache.instrument(text, path, other)
    assert calls[-2:] == [SPEC + "copy.py", path] and len(list(cache.glob("*.json"))) == 3


def test_turned_off_or_unwritable_it_only_transforms(sglang_release, recipe, cache, calls, monkeypatch):
    path = SPEC + "ngram_worker.py"
    text = files(sglang_release("0.5.16"))[path]
    monkeypatch.setenv("EAGLEPATCH_TRANSFORM_CACHE", "0")
    transform_cache.instrument(text, path, recipe)
    transform_cache.instrument(text, path, recipe)
    assert len(calls) == 2 and not cache.exists()
    monkeypatch.delenv("EAGLEPATCH_TRANSFORM_CACHE")
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder would be")
    assert transform_cache.instrument(text, path, recipe) == real_instrument(text, path, recipe)
    assert len(calls) == 3


def test_at_most_max_entries_are_kept_the_least_used_going_first(recipe, cache, calls, monkeypatch):
    monkeypatch.setattr(transform_cache, "MAX_ENTRIES", 3)
    texts = [f"x = {i}\n" for i in range(5)]
    for i, t in enumerate(texts[:3]):
        transform_cache.instrument(t, f"f{i}.py", recipe)
    import os
    import time

    for i, f in enumerate(sorted(cache.glob("*.json"), key=lambda f: f.stat().st_mtime)):
        os.utime(f, (time.time() - 100 + i, time.time() - 100 + i))
    transform_cache.instrument(texts[0], "f0.py", recipe)  # a hit: now the most recent
    transform_cache.instrument(texts[3], "f3.py", recipe)
    assert len(list(cache.glob("*.json"))) == 3
    n = len(calls)
    transform_cache.instrument(texts[0], "f0.py", recipe)
    transform_cache.instrument(texts[3], "f3.py", recipe)
    assert len(calls) == n  # both kept
    transform_cache.instrument(texts[1], "f1.py", recipe)
    assert len(calls) == n + 1  # the oldest went


def test_an_apply_whose_files_are_all_cached_needs_no_transform(sglang_release, recipe, cache, monkeypatch):
    """plan_apply of a release the client has instrumented before reads every result from the cache: the
    transform (libcst) is not needed; the same plan as with the transform."""
    from eaglepatch.hosts.local import LocalHost
    from eaglepatch.ops.facts import gather
    from eaglepatch.ops.options import FactsOptions, RuntimeOptions
    from eaglepatch.ops.plan import plan_apply

    host = LocalHost()
    try:
        facts = gather(host, FactsOptions(sglang_path=str(sglang_release("0.5.16") / "sglang")),
                       sorted(recipe.entry_names))
    finally:
        host.close()
    first = plan_apply(facts, recipe, RuntimeOptions(), now=0.0)  # the transform runs, its results kept

    def no_transform():
        raise AssertionError("the transform was needed")

    monkeypatch.setattr(lazy_engine, "engine", no_transform)
    assert plan_apply(facts, recipe, RuntimeOptions(), now=0.0) == first


def test_hits_are_expected_once_a_result_of_this_transform_and_recipe_is_kept(recipe, cache, calls, monkeypatch):
    """``expects_hits``: not on a client that kept nothing, yes once a result of this recipe is kept, not for
    another recipe, not with the cache turned off."""
    assert transform_cache.expects_hits(recipe) is False
    transform_cache.instrument("x = 1\n", "f.py", recipe)
    assert transform_cache.expects_hits(recipe) is True
    assert transform_cache.expects_hits(dataclasses.replace(recipe, source="another recipe")) is False
    monkeypatch.setenv("EAGLEPATCH_TRANSFORM_CACHE", "0")
    assert transform_cache.expects_hits(recipe) is False
