"""The TARGETs of a command: how to reach them (``Connect``), each parsed once into a ``TargetSpec``
(``target_spec``; ``check_targets`` for all of them, before any is touched), opened (``Target``), and its facts
read (``target_facts``). What tuning and doctor open a target with too."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from eaglepatch.errors import UsageError
from eaglepatch.hosts.base import Host
from eaglepatch.hosts.spec import SSHOptions, TargetSpec
from eaglepatch.hosts.target import open_host, parse_target
from eaglepatch.ops import lazy_engine, transform_cache
from eaglepatch.ops.facts import HostFacts, gather
from eaglepatch.ops.options import FactsOptions
from eaglepatch.transform.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class Connect:
    """How to reach targets: the SSH options plus what discovery may be told."""

    identity: str | None = None
    port: int | None = None
    jump: str | None = None
    connect_timeout: float | None = None  # None: the SSH config's ConnectTimeout, else 10 s
    accept_new_host_key: bool = False
    facts: FactsOptions = FactsOptions()

    def ssh(self) -> SSHOptions:
        return SSHOptions(identity=self.identity, port=self.port, jump=self.jump,
                          connect_timeout=self.connect_timeout, accept_new_host_key=self.accept_new_host_key)


def target_spec(text: str, c: Connect) -> TargetSpec:
    """One TARGET parsed with the connection options; raises UsageError for a bad form, an SSH option with a
    local path, or a local path that does not exist."""
    spec = parse_target(text, c.ssh())
    if spec.is_local and c.facts.sglang_path is None and not os.path.exists(spec.path or ""):
        raise UsageError(f"{text}: no such file or directory")
    return spec


def check_targets(texts: Sequence[str], c: Connect) -> list[TargetSpec]:
    """Every TARGET parsed, in order: the usage errors of any (bad form, an SSH option with a local path, a local
    path that does not exist) come before any target is touched: with several TARGETs, one bad one must not leave
    the others half done."""
    return [target_spec(text, c) for text in texts]


class Target:
    """An open connection to one target, closed on exit."""

    def __init__(self, spec: TargetSpec, c: Connect):
        self.spec = spec
        facts_opts = c.facts
        if spec.is_local and facts_opts.sglang_path is None:
            facts_opts = dataclasses.replace(facts_opts, sglang_path=spec.path)
        self.facts_opts = facts_opts
        self.host: Host = open_host(spec)

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.host.close()


def target_facts(t: Target, recipe: Recipe, lock_owner: dict[str, Any] | None = None,
                 transform: bool = True) -> HostFacts:
    """The target's facts; with ``transform`` (the command goes on to analyse or instrument the files), the
    transform's import runs meanwhile, while the round trip waits on the host, unless the client's cache of its
    results is likely to hold them all (``transform_cache.expects_hits``)."""
    if transform and not transform_cache.expects_hits(recipe):
        lazy_engine.preload_transform()
    return gather(t.host, t.facts_opts, sorted(recipe.entry_names), lock_owner=lock_owner)
