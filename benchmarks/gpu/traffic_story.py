#!/usr/bin/env python3
"""Real text, not token soup (issue 39), on a real SGLang 0.5.16 EAGLE3 server with a draft whose acceptance
depends on the prompt by construction: does ``eaglepatch bench --prompts`` give each prompt set its own accept
length, does a sweep find each set's own best step count, and does bench say so when the server's other traffic
is not like its load?

Run by benchmarks/gpu/traffic_story.sh on the GPU machine (the testbed's bundle in /tmp/site, eaglepatch installed
in /tmp/ep, prelude.sh). The models (make_known_models.py ``--regions PA,PB``, ``tiny`` shape): the target's greedy
walk runs in one of two regions of ids and never leaves it, the draft agrees with it on a share PA of region A's
ids and PB of B's. Two prompt sets (region_prompts.py): ``codeish`` (text to /generate, every word in A) and
``chatty`` (chat messages to /v1/chat/completions through the tokenizer's chat template, every word in B). A
request's accept length at k steps is then exactly known (known_truth.expected: the walk of the load's prompts;
about 1 + p + ... + p^k of its region).

Stages (``STAGES``, in order; each skipped, and said so, when too little of BUDGET is left):

* ``bench``: ``eaglepatch apply --no-restart``, the server launched at STEPS (3) draft steps, then ``bench --prompts
  codeish`` and ``bench --prompts chatty`` (``--ignore-eos --json``, REQ requests CONC at a time, MAX_NEW tokens
  each): each set's accept length (the timing records' decode group, and the server's) against the exact figure
  of its requests: within 2%?
* ``traffic``: a plain HTTP client (no eaglepatch request id: other users' traffic), TRAFFIC_CONC requests at a
  time of codeish text to /generate, runs while ``bench --prompts chatty`` runs: bench's ``"traffic"`` key
  (``{"cycles", "accept_len", "acceptance"}``; null when this eaglepatch has none) and its note, JSON and text
  (``render_bench`` of the same document); then the same with traffic of chatty prompts (the chat template's
  text, to /generate: the same tokens) while bench chatty runs: no note expected.
* ``sweep_codeish``, ``sweep_chatty``: ``eaglepatch sweep --grid speculative-num-steps=SWEEP_GRID --keep-best
  --prompts SET`` (a restart per point; no baseline: a launch each is what one call affords): each set's best
  step count, and whether they differ. The sweep's run order is fixed by its identity (sweep_state.sweep_id, the
  load's ``--seed`` in it): the story takes the first ``--seed`` whose order runs the expected best point last,
  so that ``--keep-best`` leaves it running without one more launch (when the measured best is another, the
  sweep launches it: a minute more, nothing wrong). After the traffic stage the server has served others' requests
  within the minute, which a restart sweep refuses unless ``--allow-shared-traffic`` (given when the installed
  eaglepatch has it: that traffic is over). The traffic stage, when it runs after a sweep, measures the server the
  sweep kept (its truth at that step count).

Everything goes to ``$OUT/traffic_story.json``, with a ``summary`` at its end (printed too). Env: OUT, T0, BUDGET,
STAGES (bench,traffic,sweep_codeish,sweep_chatty), REGIONS (0.9,0.2), MAKE_SEED (2: make_known_models' pick for
0.9,0.2 on the tiny shape; empty: let it pick), SHAPE (tiny), STEPS (3), REQ (32), CONC (4), MAX_NEW (256),
N_PROMPTS (32), TRAFFIC_CONC (2), SWEEP_GRID (1,6), SWEEP_REQ (48), SWEEP_WARMUP (4), MAX_BS (8), TOLERANCE (0.02).

``REHEARSAL=1`` runs the same story on this machine against the stand-in server of tests/stubs (no GPU, no
models: known.json alone; its acceptance is not the construction's, so the figures are not the point): it checks
the script's plumbing (eaglepatch as this checkout has it, the traffic client, the sweeps, the cleanup), not
sglang. ``REHEARSAL_DIR`` (default /tmp/traffic_rehearsal) holds its tree, logs and cache.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

import importlib.util
import subprocess

import known_truth  # noqa: E402
import region_prompts  # noqa: E402
import story_lib as S  # noqa: E402

REHEARSAL = os.environ.get("REHEARSAL") == "1"

STAGES = [s for s in os.environ.get("STAGES", "bench,traffic,sweep_codeish,sweep_chatty").split(",") if s]
REGIONS = os.environ.get("REGIONS", "0.9,0.2")
MAKE_SEED = os.environ.get("MAKE_SEED", "2" if REGIONS == "0.9,0.2" else "")
SHAPE = os.environ.get("SHAPE", "tiny")
STEPS = int(os.environ.get("STEPS", "3"))
REQ = int(os.environ.get("REQ", "32"))
CONC = int(os.environ.get("CONC", "4"))
MAX_NEW = int(os.environ.get("MAX_NEW", "256"))
N_PROMPTS = int(os.environ.get("N_PROMPTS", "32"))
TRAFFIC_CONC = int(os.environ.get("TRAFFIC_CONC", "2"))
SWEEP_GRID = [int(x) for x in os.environ.get("SWEEP_GRID", "1,6").split(",")]
SWEEP_REQ = int(os.environ.get("SWEEP_REQ", "48"))
SWEEP_WARMUP = int(os.environ.get("SWEEP_WARMUP", "4"))
MAX_BS = int(os.environ.get("MAX_BS", "8"))
TOL = float(os.environ.get("TOLERANCE", "0.02"))
LOG_WAIT = 3.0
SWEEP_LOG_WAIT = 2.0
MDIR = f"/tmp/known_regions_{REGIONS.replace(',', '_')}_{SHAPE}"
PDIR = "/tmp/region_prompts"
NEED = {"bench": 200.0, "traffic": 50.0, "sweep": 150.0}  # seconds a stage takes at least (a launch: 55-75 s)
SETS: dict[str, dict] = {}  # name -> region_prompts.write_sets' info
KNOWN: dict = {}
NOW = {"steps": STEPS, "traffic_ran": False}  # the running server's step count (a sweep's kept best changes it)

if REHEARSAL:  # the stand-in server of tests/stubs in place of sglang on a GPU (story_lib's constants redirected)
    _ROOT = Path(__file__).resolve().parent.parent.parent
    _spec = importlib.util.spec_from_file_location(
        "standin_harness", _ROOT / "tests" / "stubs" / "stand_in_sglang" / "standin_harness.py")
    harness = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(harness)
    BASE = Path(os.environ.get("REHEARSAL_DIR", "/tmp/traffic_rehearsal"))
    MDIR, PDIR = str(BASE / "models"), str(BASE / "prompts")
    S.SITE = BASE / "site"
    S.TARGET = str(S.SITE / "sglang")
    S.PORT = harness.free_port()
    S.LOG_DIR = str(BASE / "eplogs")
    S.COMMON = ["--port", str(S.PORT), "--startup-delay", "1", "--sim-batch"]
    S.EP_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    S.EP_ENV["XDG_CACHE_HOME"] = str(BASE / "cache")
    NEED = {"bench": 20.0, "traffic": 10.0, "sweep": 15.0}

    def _ep(*args: str, timeout: float = 300) -> tuple[int, str, str]:
        """story_lib.ep with this checkout's eaglepatch, run from BASE (not /tmp: a folder there may shadow it)."""
        t = time.time()
        try:
            p = subprocess.run([S.PY, "-m", "eaglepatch", *args], env=S.EP_ENV, cwd=str(BASE),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = 124, "", f"{exc.stderr or ''}\n(timed out)"
        S.log(f"$ eaglepatch {' '.join(args)}: exit {rc} in {time.time() - t:.1f}s")
        for line in str(err).strip().splitlines()[-5:]:
            print("  | " + line, flush=True)
        S.story["steps"].append({"cmd": "eaglepatch " + " ".join(args), "rc": rc,
                                 "seconds": round(time.time() - t, 1), "stderr_tail": str(err)[-1500:]})
        return rc, out, err

    S.ep = _ep


def prepare_rehearsal() -> None:
    """The stand-in tree (the adaptive V2 worker, as live_story's rehearsal) and models that are known.json alone."""
    import shutil

    import make_known_models as mk

    shutil.rmtree(BASE, ignore_errors=True)
    harness.make_tree(S.SITE, None)
    harness.add_adaptive(S.SITE / "sglang")
    for sub in ("target", "draft"):
        os.makedirs(f"{MDIR}/{sub}", exist_ok=True)
        Path(f"{MDIR}/{sub}/config.json").write_text("{}")
    pa, pb = (float(x) for x in REGIONS.split(","))
    f, _finv, member, regions = mk.construction_regions(1024, pa, pb, int(MAKE_SEED or 0))
    Path(f"{MDIR}/known.json").write_text(json.dumps({"p": None, "used": 1024, "shape": "rehearsal", "seed":
                                                      int(MAKE_SEED or 0), "regions": regions, "f": f,
                                                      "member": [int(m) for m in member]}))


def loadspec(path: str, requests: int, seed: int = 0):
    """eaglepatch's own LoadSpec (as installed) of a bench of ``path``: the requests it sends, in its order."""
    if "/tmp/ep" not in sys.path:
        sys.path.insert(0, "/tmp/ep")
    from eaglepatch.tuning.load import LoadSpec

    return LoadSpec(requests=requests, concurrency=CONC, max_new_tokens=MAX_NEW, warmup=4, seed=seed,
                    prompt_source=path, ignore_eos=True)


def truth(name: str, steps: int, requests: int, seed: int = 0) -> dict:
    """The exact accept length of a bench of set ``name`` (its ``requests`` measured requests, ``--seed seed``)."""
    reqs = loadspec(SETS[name]["path"], requests, seed).draw(requests)
    ends = [known_truth.last_token({"prompt": r.text, "messages": r.messages}) for r in reqs]
    out = known_truth.expected(ends, KNOWN, steps, MAX_NEW)
    out["stays_in_region"] = all(known_truth.stays_in_region(t, KNOWN["f"], KNOWN["regions"], 2 * MAX_NEW)
                                 for t in set(ends))
    return out


def render(doc: dict | None) -> str:
    """bench's text for ``doc``, as the installed eaglepatch prints it without --json."""
    if doc is None:
        return ""
    if "/tmp/ep" not in sys.path:
        sys.path.insert(0, "/tmp/ep")
    from eaglepatch.tuning.bench import render_bench

    try:
        return render_bench(doc)
    except Exception as exc:  # noqa: BLE001  (a render that fails is a finding, not the story's end)
        return f"(render_bench failed: {exc!r})"


def rel(got: float | None, want: float | None) -> float | None:
    return None if got is None or not want else round(got / want - 1, 5)


def accept_figures(doc: dict | None, want: dict) -> dict:
    """A bench's accept lengths (the timing records' decode group: eaglepatch's; the client's: the server's
    ``completion / spec_verify_ct``) against the exact ``want``."""
    g = S.decode_group(doc) or {}
    c = (doc or {}).get("client") or {}
    rec, srv = g.get("accept_len"), c.get("accept_len")
    return {"records": rec, "server": srv, "truth": want["accept_len"], "truth_server": want["server_accept_len"],
            "formula": want["formula"], "records_rel": rel(rec, want["accept_len"]),
            "server_rel": rel(srv, want["server_accept_len"]),
            "within": None if rec is None else abs(rec / want["accept_len"] - 1) <= TOL,
            "server_within": None if srv is None else abs(srv / want["server_accept_len"] - 1) <= TOL}


def slim(doc: dict | None) -> dict | None:
    """What the story keeps of a bench document: all but the per-phase rows of its timing report."""
    if doc is None:
        return None
    g = S.decode_group(doc) or {}
    return {"load": doc.get("load"), "categories": doc.get("categories"), "client": doc.get("client"),
            "window": doc.get("window"), "notes": doc.get("notes"), "traffic": doc.get("traffic", "ABSENT"),
            "decode": {k: g.get(k) for k in ("n", "accept_len", "acceptance", "tokens_per_s", "wall_tokens_per_s",
                                             "cycle_ms")},
            "groups": [{k: gr.get(k) for k in ("mode", "n", "accept_len", "bs")}
                       for gr in ((doc.get("timings") or {}).get("groups") or [])]}


# ---------------------------------------------------------------------------------------------------------------
# the other users' traffic: plain requests, no eaglepatch request id


class Traffic:
    """``conc`` threads, each sending the ``texts`` in turn to /generate (greedy, ``ignore_eos``, MAX_NEW tokens)
    until stopped; per request its tokens and the server's ``spec_verify_ct``."""

    def __init__(self, name: str, texts: list[str], conc: int):
        self.name, self.texts, self.conc = name, texts, conc
        self.stop = threading.Event()
        self.done: list[dict] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(conc)]

    def _loop(self, i: int) -> None:
        n = i
        while not self.stop.is_set():
            text = self.texts[n % len(self.texts)]
            n += self.conc
            body = json.dumps({"text": text, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0,
                                                                 "ignore_eos": True}}).encode()
            t = time.time()
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{S.PORT}/generate", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=120) as r:
                    meta = json.loads(r.read()).get("meta_info") or {}
                row = {"t0": round(t, 3), "t1": round(time.time(), 3), "last": known_truth.token(text.split()[-1]),
                       "tokens": meta.get("completion_tokens"), "verify_ct": meta.get("spec_verify_ct")}
                with self.lock:
                    self.done.append(row)
            except Exception as exc:  # noqa: BLE001
                with self.lock:
                    self.errors.append(repr(exc)[:200])
                time.sleep(0.5)

    def __enter__(self) -> "Traffic":
        for th in self.threads:
            th.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for th in self.threads:
            th.join(timeout=150)

    def summary(self) -> dict:
        ok = [r for r in self.done if r["tokens"] and r["verify_ct"]]
        toks, ct = sum(r["tokens"] for r in ok), sum(r["verify_ct"] for r in ok)
        want = known_truth.expected(sorted({r["last"] for r in self.done}) or [0], KNOWN, NOW["steps"], MAX_NEW)
        return {"set": self.name, "conc": self.conc, "requests": len(self.done), "errors": self.errors[:5],
                "server_accept_len": round(toks / ct, 4) if ct else None, "truth_formula": want["formula"],
                "truth_ends_regions": want["regions"]}


def traffic_texts(name: str) -> list[str]:
    """The set's prompts as text: codeish's as they are, chatty's as its chat template makes them (the same tokens
    the chat endpoint feeds the model)."""
    with open(SETS[name]["path"]) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [r["prompt"] if r.get("messages") is None else known_truth.chat_text(r["messages"]) for r in rows]


# ---------------------------------------------------------------------------------------------------------------
# stages


def stage_bench(srv_box: list) -> None:
    rc, _, _ = S.ep("apply", S.TARGET, "--no-restart", "--log-dir", S.LOG_DIR, "--json")
    if rc:
        raise SystemExit("apply failed")
    S.story["patched"] = True
    argv = [S.PY, "-m", "sglang.launch_server", "--model-path", f"{MDIR}/target", *S.spec_flags(MDIR, STEPS),
            *S.COMMON, "--cuda-graph-max-bs", str(MAX_BS)]
    srv = S.Server(f"k{STEPS}", argv)
    srv.rec.update(steps=STEPS, patched=True)
    srv_box.append(srv)
    if not srv.up(max(60.0, S.left() - 60)):
        raise SystemExit("the server did not come up")
    out = S.story["bench"] = {}
    for name in ("codeish", "chatty"):
        if S.left() < 25:
            break
        doc, err = S.bench_prompts(SETS[name]["path"], REQ, CONC, MAX_NEW, log_wait=LOG_WAIT,
                                   timeout=max(30.0, S.left() - 10))
        want = truth(name, STEPS, REQ)
        acc = accept_figures(doc, want)
        out[name] = {"region": SETS[name]["region"], "chat": SETS[name]["chat"], "truth": want, "accept": acc,
                     "bench": slim(doc), "stderr_tail": err[-1200:]}
        S.log(f"bench {name}: accept records {acc['records']} server {acc['server']} truth {acc['truth']:.4f} "
              f"(formula {want['formula']}): {acc['records_rel']} -> within {TOL:.0%}: {acc['within']}")


def stage_traffic() -> None:
    out = S.story["traffic"] = {}
    NOW["traffic_ran"] = True
    for case, other in (("differ", "codeish"), ("match", "chatty")):
        if S.left() < 25:
            S.log(f"traffic {case}: SKIPPED, {S.left():.0f} s left")
            break
        tr = Traffic(other, traffic_texts(other), TRAFFIC_CONC)
        with tr:
            time.sleep(2.0)  # the traffic under way before the load's warm-up
            doc, err = S.bench_prompts(SETS["chatty"]["path"], REQ, CONC, MAX_NEW, log_wait=LOG_WAIT,
                                       timeout=max(30.0, S.left() - 10))
        text = render(doc)
        notes = (doc or {}).get("notes") or []
        out[case] = {"load": "chatty", "traffic_set": other, "expect_note": case == "differ",
                     "traffic_key": (doc or {}).get("traffic") if doc is not None and "traffic" in doc else None,
                     "traffic_key_present": doc is not None and "traffic" in doc,
                     "json_notes_traffic": [n for n in notes if "traffic" in n.lower()],
                     # the text's lines on the traffic (its first line names the prompts' file: left out)
                     "text_notes_traffic": [ln for ln in text.splitlines()[1:] if "traffic" in ln.lower()],
                     "traffic_client": tr.summary(), "bench": slim(doc), "text": text[-4000:],
                     "stderr_tail": err[-1200:],
                     "steps": NOW["steps"], "load_truth": truth("chatty", NOW["steps"], REQ)}
        o = out[case]
        # the note that they differ is in the JSON's notes only when they do (the text may say more either way)
        o["note_as_expected"] = bool(o["json_notes_traffic"]) == o["expect_note"]
        o["differs"] = (o["traffic_key"] or {}).get("differs")
        S.log(f"traffic {case} ({other} traffic, chatty load): traffic key {json.dumps(o['traffic_key'])[:300]}; "
              f"JSON notes {o['json_notes_traffic']}; text {o['text_notes_traffic']}; as expected: "
              f"{o['note_as_expected']}")


def expected_best(p: float) -> int:
    """The step count of SWEEP_GRID that the construction makes best for acceptance ``p``, with a cycle that grows
    by about 10% a draft step (the tiny shape's, measured: bound by the host's launches)."""
    return max(SWEEP_GRID, key=lambda k: known_truth.formula(p, k) / (1 + 0.1 * k))


def plan_seed(path: str, want_last: int) -> tuple[int, str | None]:
    """The first ``--seed`` (0-15) whose sweep (its identity, as eaglepatch computes it) runs ``want_last`` last;
    (0, None) when it cannot be told."""
    try:
        if "/tmp/ep" not in sys.path:
            sys.path.insert(0, "/tmp/ep")
        from eaglepatch.cli import _bench_options
        from eaglepatch.tuning import sweep as sw
        from eaglepatch.tuning import sweep_state
        from eaglepatch.tuning.drive import SweepOptions

        for seed in range(16):
            bo = _bench_options(SWEEP_REQ, str(CONC), 128, MAX_NEW, SWEEP_WARMUP, seed, SWEEP_LOG_WAIT, None, path,
                                0.0, 1.0, True, None)
            grid = ("speculative-num-steps=" + ",".join(map(str, SWEEP_GRID)),)
            _, _, points = SweepOptions(grid=grid, keep_best=True, bench=bo).points()
            ident = sweep_state.sweep_id(S.TARGET, points, 1, bo.load_json())
            last = points[sw.plan_runs(points, 1, ident)[-1][0]]
            if dict(last.flags).get("speculative-num-steps") == str(want_last):
                return seed, ident
    except Exception as exc:  # noqa: BLE001
        S.log(f"plan_seed: {exc!r}")
    return 0, None


def stage_sweep(name: str) -> None:
    p = SETS[name]["p"]
    want = expected_best(p)
    seed, ident = plan_seed(SETS[name]["path"], want)
    args = ["sweep", S.TARGET, "--grid", "speculative-num-steps=" + ",".join(map(str, SWEEP_GRID)), "--keep-best",
            "--prompts", SETS[name]["path"], "--ignore-eos", "--seed", str(seed), "--requests", str(SWEEP_REQ),
            "--concurrency", str(CONC), "--max-new-tokens", str(MAX_NEW), "--warmup", str(SWEEP_WARMUP),
            "--log-wait", str(SWEEP_LOG_WAIT), "--timeout", "300", "--json"]
    # the traffic stage's requests of a minute ago would have the sweep refuse (the server serves others): they
    # are over; this eaglepatch has the flag when its command line's modules name it
    pkg = Path(S.EP_ENV.get("PYTHONPATH") or str(Path(__file__).resolve().parents[2])) / "eaglepatch"
    shared = NOW["traffic_ran"] and any("--allow-shared-traffic" in f.read_text()
                                        for f in (pkg / "cli.py", pkg / "cli_options.py") if f.is_file())
    if shared:
        args.insert(-1, "--allow-shared-traffic")
    t = time.time()
    rc, out, err = S.ep(*args, timeout=max(60.0, S.left() - 15))
    if rc != 0 and not shared and "--allow-shared-traffic" in err:  # refused all the same: again with the flag
        shared = True
        args.insert(-1, "--allow-shared-traffic")
        rc, out, err = S.ep(*args, timeout=max(60.0, S.left() - 15))
    doc = json.loads(out) if rc == 0 and out.strip() else None
    rec: dict = {"set": name, "region": SETS[name]["region"], "p": p, "seed": seed, "planned_ident": ident,
                 "allow_shared_traffic": shared,
                 "expected_best_steps": want, "rc": rc, "seconds": round(time.time() - t, 1),
                 "stderr_tail": err[-3000:], "sweep": doc}
    if doc is not None:
        rec["ident_as_planned"] = ident is not None and ident in str(doc.get("state_file", ""))
        pts = []
        for i, pt in enumerate(doc.get("points") or []):
            flags = pt.get("flags") or {}
            flags = flags if isinstance(flags, dict) else dict(map(tuple, flags))
            k = int(flags.get("speculative-num-steps", 0))
            want_acc = truth(name, k, SWEEP_REQ, seed) if k else None
            tps = (pt.get("tokens_per_s") or {}).get("median")
            pts.append({"steps": k, "tokens_per_s": tps, "accept_len": pt.get("accept_len"),
                        "truth_server_accept_len": want_acc and want_acc["server_accept_len"],
                        "truth_accept_len": want_acc and want_acc["accept_len"], "best": i == doc.get("best")})
        rec["points"] = pts
        best = doc.get("best")
        rec["best_steps"] = pts[best]["steps"] if best is not None else None
        rec["restarted_to_keep_best"] = ((doc.get("restore") or {}).get("restarted"))
        if rec["best_steps"] is not None:
            NOW["steps"] = rec["best_steps"]  # --keep-best: the best point's server runs now
    if doc is None and ident is not None:  # cut short: the runs its state file saved
        path = Path(S.EP_ENV["XDG_CACHE_HOME"]) / "eaglepatch" / "sweeps"
        files = sorted(path.glob(f"*-{ident}.jsonl"))
        if files:
            lines = [json.loads(x) for x in files[0].read_text().splitlines()[1:] if x.strip()]
            rec["state_runs"] = [{k: r.get(k) for k in ("point", "status", "tokens_per_s", "accept_len", "ready_s")}
                                 for r in lines if "point" in r]
    S.story.setdefault("sweeps", {})[name] = rec
    S.log(f"sweep {name}: best {rec.get('best_steps')} steps (expected {want}); points "
          f"{[(q['steps'], q['tokens_per_s'], q['accept_len']) for q in rec.get('points', [])]}")


def summarize() -> dict:
    st = S.story
    b, tr, sw = st.get("bench") or {}, st.get("traffic") or {}, st.get("sweeps") or {}
    out: dict = {"regions": KNOWN.get("regions") and [{k: r[k] for k in ("name", "lo", "hi", "p")}
                                                      for r in KNOWN["regions"]]}
    out["accept"] = {n: {k: d["accept"][k] for k in ("records", "server", "truth", "records_rel", "within",
                                                     "server_within")} for n, d in b.items()}
    out["traffic"] = {c: {"traffic_key": d["traffic_key"], "json_notes": d["json_notes_traffic"],
                          "text_lines": d["text_notes_traffic"], "as_expected": d["note_as_expected"]}
                      for c, d in tr.items()}
    out["best_steps"] = {n: d.get("best_steps") for n, d in sw.items()}
    if len(out["best_steps"]) == 2:
        vals = list(out["best_steps"].values())
        out["best_steps_differ"] = None if None in vals else vals[0] != vals[1]
    out["sweep_points"] = {n: [(q["steps"], q["tokens_per_s"], q["accept_len"]) for q in d.get("points", [])]
                           for n, d in sw.items()}
    out["skipped"] = st.get("skipped", [])
    out["elapsed_s"] = round(time.time() - S.T0, 1)
    return out


def main() -> int:
    S.OUT.mkdir(parents=True, exist_ok=True)
    S.story.update(rehearsal=REHEARSAL, regions_arg=REGIONS, shape=SHAPE, spec_steps=STEPS, req=REQ, conc=CONC,
                   max_new=MAX_NEW, traffic_conc=TRAFFIC_CONC, sweep_grid=SWEEP_GRID, sweep_req=SWEEP_REQ,
                   sweep_warmup=SWEEP_WARMUP, max_bs=MAX_BS, stages=STAGES, tolerance=TOL)
    if REHEARSAL:
        prepare_rehearsal()
    made = S.make_known_regions(MDIR, REGIONS, SHAPE, MAKE_SEED or None)
    if made is not None:
        S.story["model"] = made
    KNOWN.update(known_truth.load_known(f"{MDIR}/known.json"))
    S.story["known"] = {k: KNOWN.get(k) for k in ("regions", "seed", "used", "shape", "members",
                                                   "walk_vs_formula_max_dev")}
    SETS.update(region_prompts.write_sets(f"{MDIR}/known.json", PDIR, N_PROMPTS, MAX_NEW))
    S.story["sets"] = SETS
    S.log(f"models and prompt sets ready: {json.dumps(S.story['known']['regions'])}")
    srv_box: list = []
    try:
        for stage in STAGES:
            need = NEED["sweep" if stage.startswith("sweep") else stage]
            if S.left() < need:
                S.log(f"{stage}: SKIPPED, {S.left():.0f} s left (needs {need:.0f})")
                S.story.setdefault("skipped", []).append(stage)
                continue
            if stage == "bench":
                stage_bench(srv_box)
            elif stage == "traffic":
                if not srv_box and S.server_pid() is None:
                    S.log("traffic: no server (run it with bench)")
                    S.story.setdefault("skipped", []).append(stage)
                    continue
                stage_traffic()
            elif stage.startswith("sweep_"):
                stage_sweep(stage.split("_", 1)[1])
            S.save("traffic_story")
    finally:
        pid = S.server_pid()  # what runs now: the story's launch, or a sweep's kept server
        if pid is not None:
            S.log(f"stopping the server (pid {pid})")
            S.stop_pid_group(pid)
        for srv in srv_box:
            srv.down()  # the story's own launch (reaped; gone already when a sweep restarted it)
        if S.story.get("patched"):
            S.ep("revert", S.TARGET, "--no-restart", "--json")
        S.story["summary"] = summarize()
        print("SUMMARY " + json.dumps(S.story["summary"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        S.save("traffic_story")
