"""Reading a target for ``doctor``, changing nothing, and the ``doctor --json`` document.

One facts round trip (the install, its servers from /proc: pid, argv, cwd, environment, children; no lock taken),
one ``doctor`` request on the host (``op_doctor`` in hostside/doctor.py: each server's log from its stdout/stderr when
they are files, its ``/server_info``, the config.json of the models its command line names, ``nvidia-smi``), the
new bytes of the timing logs (into this machine's cache, as ``report`` fetches them), and the sweep state files
on this machine. Then the rules (``eaglepatch.doctor.rules``) per server.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Callable, Sequence

from eaglepatch.server.argv import parse_flags, server_args_of
from eaglepatch.doctor.facts import (
    LOG_FILTER,
    LogFacts,
    ServerFacts,
    model_config,
    parse_gpu_list,
    parse_log,
    parse_topo,
)
from eaglepatch.doctor.finding import Finding
from eaglepatch.doctor.rules import diagnose
from eaglepatch.doctor.facts import evidence
from eaglepatch.redact import mask_argv, mask_text
from eaglepatch.tuning import traffic
from eaglepatch.tuning.saved import find_sweep

Say = Callable[[str], None]
# the server's environment variables that rules look at
_ENV_KEEP = re.compile(r"^(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN|NCCL_[A-Z_]+|CUDA_VISIBLE_DEVICES)$")



def _min_cycles() -> int:
    """The decode cycles a prediction needs (``report --predict``'s own floor)."""
    from eaglepatch.report.predict import MIN_CYCLES

    return MIN_CYCLES

def doctor(spec: Any, c: Any, say: Say, log_dir: str | None = None) -> Any:
    """The ``doctor --json`` document of each server of the target's install (``--server-port`` picks): one
    object for one server, a list for several."""
    from eaglepatch.errors import EaglepatchError
    from eaglepatch.ops import lifecycle as lc
    from eaglepatch.ops.facts import code_state
    from eaglepatch.hosts.agent import call
    from eaglepatch.ops.logs import fetch_logs_from
    from eaglepatch.ops.target import Target, target_facts
    from eaglepatch.transform.recipe import builtin_recipe

    with Target(spec, c) as t:
        name = t.spec.name
        facts = target_facts(t, builtin_recipe(), transform=False)  # no lock: doctor changes nothing
        servers = lc.chosen(facts, c.facts.server_ports)
        if not servers:
            return no_server_doc(name, facts.version, facts.package_dir)
        patched = bool(facts.manifest) and facts.runtime_sha256 is not None
        ldir = log_dir or ((facts.manifest or {}).get("runtime") or {}).get("log_dir") or (
            "/tmp/eaglepatch" if patched else None)
        payload = []
        for srv in servers:
            flags = parse_flags(server_args_of(srv.argv))
            models = [m for m in (flags.get("model-path"), flags.get("speculative-draft-model-path"))
                      if isinstance(m, str) and m]
            env = srv.env or {}
            payload.append({"pid": srv.pid, "children": list(srv.children), "port": srv.port,
                            "host": srv.probe_host, "api_key": srv.api_key, "cwd": srv.cwd, "models": models,
                            "env": {k: env[k] for k in ("HOME", "HF_HOME", "HF_HUB_CACHE") if k in env}})
        say(f"{name}: reading {len(servers)} server(s): logs, /server_info, model configs, nvidia-smi")
        raw = call(t.host, facts.python, "doctor", timeout=180, servers=payload, filter=LOG_FILTER)
        folder, log_note = None, None
        if ldir and (patched or log_dir):
            try:
                pids = {p for srv in servers for p in (srv.pid, *srv.children)}
                folder = fetch_logs_from(t.host, name, facts.python, ldir, lambda _m: None, pids=pids)
            except EaglepatchError as exc:  # a refusal, or a host that did not answer in time: no records
                log_note = str(exc)
        overlap = any(os.path.basename(f.path) == "eagle_worker_v2.py" for f in facts.files)
        gpus = raw.get("gpus") or {}
        docs = []
        for srv, got in zip(servers, raw.get("servers") or []):
            state = "not-patched"
            if patched:
                state = "stale" if code_state(srv.started_at, facts) == "stale" else "patched"
            sf, sources = server_facts(name, facts.version, srv, got, gpus, state, ldir, folder, log_note, overlap)
            findings = diagnose(sf)
            docs.append(document(name, facts.version, srv, findings, sources, sf.model))
        return docs[0] if len(docs) == 1 else docs


def _masked(obj: Any) -> Any:
    """``obj`` (findings, sources) with every string in it masked as a log line is (``mask_text``)."""
    if isinstance(obj, str):
        return mask_text(obj)
    if isinstance(obj, dict):
        return {k: _masked(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_masked(v) for v in obj]
    return obj


def no_server_doc(name: str, version: str | None, package_dir: str) -> dict[str, Any]:
    f = Finding("no-server", "info", "no sglang server of this install is running",
                [evidence("install", f"sglang {version or '?'} at {package_dir}: no server runs it (eaglepatch "
                                     "status lists the servers of other installs)")],
                "start the server (python -m sglang.launch_server ...), put load on it, then run doctor again")
    return {"target": name, "sglang_version": version, "server": None, "findings": [f.to_json()], "sources": {}}


def document(name: str, version: str | None, srv: Any, findings: Sequence[Finding],
             sources: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, Any]:
    """``doctor --json`` for one server (docs/contract.md); secrets masked (eaglepatch.redact): in its command line
    and in every text of its findings and sources (evidence quotes the server's log: sglang's
    ``server_args=ServerArgs(...)`` line holds its API key); ``model``: the prediction from its timing records
    (``model_of``), when there are some."""
    doc = {"target": name, "sglang_version": version,
           "server": {"pid": srv.pid, "argv": mask_argv(srv.argv), "port": srv.port},
           "findings": _masked([f.to_json() for f in findings]), "sources": _masked(sources)}
    if model is not None:
        doc["model"] = model
    return doc


def server_facts(name: str, version: str | None, srv: Any, got: dict[str, Any], gpus: dict[str, Any], patch: str,
                 log_dir: str | None, folder: str | None, log_note: str | None,
                 overlap: bool) -> tuple[ServerFacts, dict[str, Any]]:
    """``ServerFacts`` of one server from what the host answered, the fetched timing logs and the sweeps here;
    and ``sources``: what was read (or why not), for the document."""
    sources: dict[str, Any] = {}
    env = srv.env or {}
    flags = parse_flags(server_args_of(srv.argv))
    kw: dict[str, Any] = dict(target=name, version=version, pid=srv.pid, port=srv.port, argv=list(srv.argv),
                              flags=flags, env={k: v for k, v in env.items() if _ENV_KEEP.match(k)}, patch=patch,
                              log_dir=log_dir, overlap_workers=overlap)
    if srv.env is None:
        sources["environment"] = "not readable (another user's process)"
    # the server's own answer
    si = got.get("server_info") or {}
    if si.get("doc") is not None:
        kw["server_info"] = si["doc"]
        sources["server_info"] = si.get("endpoint")
    else:
        sources["server_info"] = f"unavailable: {si.get('error') or 'not asked'}"
    # its log: the file with the most decode lines (stdout and stderr are usually the same file)
    logs = [x for x in got.get("logs") or [] if x.get("lines") is not None]
    if logs:
        parsed = [parse_log(x["lines"], x["path"]) for x in logs]
        best = max(parsed, key=lambda lf: (len(lf.decode), lf.server_args is not None))
        kw["log"] = best
        sources["server_log"] = {"path": best.path, "decode_lines": len(best.decode)}
    else:
        why = [x.get("error") for x in got.get("logs") or [] if x.get("error")]
        other = got.get("log_other") or []
        sources["server_log"] = ("unavailable: " + ("; ".join(why) if why else
                                                   f"stdout/stderr are not files ({', '.join(other) or 'closed'})"))
    # the models' configs
    configs = got.get("configs") or {}
    for key, flag in (("target_config", "model-path"), ("draft_config", "speculative-draft-model-path")):
        m = flags.get(flag)
        if isinstance(m, str) and m:
            cfg = model_config(m, configs.get(m))
            kw[key] = cfg
            sources[key] = cfg.path if cfg.data is not None else f"unavailable: {cfg.error} ({m})"
    # sweeps of this server kept on this machine (a baseline there is the model's no-speculation point)
    kw["sweep"] = find_sweep(name, srv)
    sources["sweep"] = kw["sweep"]["path"] if kw["sweep"] else "none of this server on this machine"
    # timing records of this server's processes
    if patch == "not-patched":
        sources["timing_log"] = "unavailable: the install is not patched"
    elif folder is None:
        sources["timing_log"] = f"unavailable: {log_note or 'no log folder'}"
    else:
        # the largest batch the server runs, as it derived it (sglang lowers --max-running-requests for speculation
        # and to its memory: 48 on the H100 testbed launched with --cuda-graph-max-bs 64)
        mrr = (kw.get("server_info") or {}).get("max_running_requests")
        model_flags = dict(flags, **{"max-running-requests": str(mrr)}) if isinstance(mrr, int) and mrr > 0 else flags
        rec = load_records(folder, {srv.pid, *srv.children},
                           None if srv.start is None else {(srv.pid, srv.start)}, kw["sweep"], model_flags)
        if rec.get("sweep_other_load"):  # a sweep counts only for the load it ran: not evidence for this server's
            sources["sweep"] = f"{kw['sweep']['path']}: not used: {rec['sweep_other_load']}"
            kw["sweep"] = None
        kw.update(rec)
        sources["timing_log"] = {"dir": log_dir, "records": rec.get("records", 0), "timer": rec.get("timer")}
    # the GPUs
    if gpus.get("error"):
        sources["nvidia_smi"] = f"unavailable: {gpus['error']}"
    else:
        kw["gpus"] = tuple(parse_gpu_list(gpus.get("list") or ""))
        kw["topo"] = parse_topo(gpus.get("topo") or "")
        sources["nvidia_smi"] = {"gpus": len(kw["gpus"]), "topology": bool(kw["topo"])}
    return ServerFacts(**kw), sources


def load_records(folder: str, pids: set[int], launches: set[tuple[int, int]] | None = None,
                 sweep: dict[str, Any] | None = None, flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``ServerFacts`` fields from the timing records that the server's processes wrote (their files in
    ``folder``) in this launch (``launches``: its ``(pid, start ticks)``; an earlier launch with the same pid
    appended to the same files): ``decode`` (the decode group of them all; under adaptive speculation, of the
    spec that ran the most cycles), ``by_rank``, ``by_bs``, ``timer``, ``records``, and ``model``
    (``model_of``); an empty dict when there are none."""
    from eaglepatch import report as rep

    from eaglepatch.ops.logs import logs_of

    # every host folder the logs came from has a subfolder of the cache (the runtime's private one too)
    files = logs_of(sorted(glob.glob(os.path.join(folder, "**", "*.jsonl"), recursive=True)), pids)
    if not files:
        return {}

    def decode_groups(by: str | None) -> tuple[tuple[dict[str, Any], ...], Any]:
        res = rep.aggregate(files, by=by, merge_runs=True, launches=launches)
        return tuple(g.to_json() for g in res.groups if g.mode == "decode"), res

    groups, res = decode_groups(None)
    if not groups:
        return {}
    by_bs, res_bs = decode_groups("bs")
    other_load = sweep_load_mismatch(sweep, by_bs)
    if other_load:
        sweep = None
    timers = sorted({part for r in res.runs for part in (r.timer or "").split("+") if part})
    # under adaptive speculation, the spec that ran the most cycles among those that draft: the zero-step state
    # (no draft, accept length 1) is not the draft's acceptance, however long a live sweep or the policy held it
    drafting = [i for i, g in enumerate(groups) if not _zero_steps((g.get("key") or {}).get("spec"))]
    main = max(drafting or range(len(groups)), key=lambda i: groups[i]["n"])
    model = model_of(res, sweep, flags)
    if model is not None:
        from eaglepatch.report.predict_bs import for_runs

        per_run = for_runs(res_bs, sweep=sweep, flags=flags, min_cycles=_min_cycles())
        if per_run:  # the runs merged: one
            model["by_bs"] = next(iter(per_run.values())).to_json()
    out = {"decode": groups[main], "records": sum(g.get("records", g["n"]) for g in groups), "timer": "+".join(timers) or None,
           "by_rank": decode_groups("rank")[0], "by_bs": by_bs, "model": model}
    if other_load:
        out["sweep_other_load"] = other_load
    shared = traffic.of_files(files, None)
    if shared is not None:  # decode cycles with requests not eaglepatch's: the load's and the traffic's acceptance
        out["traffic"] = shared
    return out


# A sweep's concurrency matches the server's load when the records' median decode batch lies within this factor
# of it (a closed loop of C requests runs batches of C or a little under, some requests being in prefill)
LOAD_MATCH = 1.5


def sweep_load_mismatch(sweep: dict[str, Any] | None, by_bs: Sequence[dict[str, Any]]) -> str | None:
    """Why ``sweep`` does not count for the load of the records (their decode groups by batch size), or None when
    it does: the records' median decode batch within ``LOAD_MATCH`` of the sweep's concurrency, or of one of its
    ladder's (or it cannot be told: no concurrency in the sweep, no batch sizes in the records)."""
    load = (sweep or {}).get("load") or {}
    if load.get("request_rate") is not None:
        return (f"it ran an open loop ({load['request_rate']:g} requests/s, at most {load.get('concurrency')} in "
                "flight), whose batch sizes it does not keep: a sweep with --concurrency at this server's load counts")
    ladder = [c for c in load.get("concurrency_ladder") or [load.get("concurrency")] if isinstance(c, int) and c >= 1]
    cycles = sorted(((g.get("key") or {}).get("bs"), g.get("n") or 0) for g in by_bs
                    if isinstance((g.get("key") or {}).get("bs"), int))
    if not ladder or not cycles:
        return None
    half, seen, median = sum(n for _, n in cycles) / 2, 0, cycles[-1][0]
    for bs, n in cycles:
        seen += n
        if seen >= half:
            median = bs
            break
    if any(c / LOAD_MATCH <= median <= c * LOAD_MATCH for c in ladder):
        return None
    return (f"it measured {', '.join(map(str, ladder))} request(s) at a time, and this server's decode cycles ran "
            f"{median} at a time (the median): a sweep counts only for its own load")


def _zero_steps(spec: Any) -> bool:
    """Whether a group's spec (``"steps=0,topk=1,draft_tokens=1"``) is sglang's adaptive zero-step state."""
    return isinstance(spec, str) and (spec == "steps=0" or spec.startswith("steps=0,"))


def model_of(res: Any, sweep: dict[str, Any] | None, flags: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """``doctor --json``'s ``"model"``: the prediction (``report --predict``) for the decode group of ``res`` that
    ran the most cycles (under adaptive speculation the spec groups also give the cost fit; ``flags``: the server's
    launch flags, for records whose run header carries none), as
    ``{"steps": k, "group": {key}, "predict": [...], "predict_best": i, "predict_notes": [...]}`` or, when no
    prediction can be made, ``{"steps": k, "predict": null, "predict_note": why}``; None without decode groups.
    A group of fewer than ``MIN_CYCLES`` decode cycles (a server that answered its health checks and no load: the
    first cycle alone can be a second of warm-up) predicts nothing."""
    from eaglepatch.report.predict import MIN_CYCLES, predict

    preds = predict(res, sweep=sweep, flags=flags, min_cycles=MIN_CYCLES)
    decode = [(g, p) for g, p in zip(res.groups, preds) if g.mode == "decode" and p is not None]
    if not decode:
        return None
    g, p = max([gp for gp in decode if not _zero_steps(gp[0].spec)] or decode, key=lambda gp: gp[0].n)
    return {"steps": p.measured_steps, "group": g.key_dict(), **p.to_json()}


def facts_for_log(lines: Sequence[str]) -> LogFacts:
    """``parse_log`` of raw log lines after the host's filter (for tests and tools)."""
    pat = re.compile(LOG_FILTER)
    return parse_log([ln for ln in lines if pat.search(ln)])
