"""The host side of ``eaglepatch doctor`` (``op_doctor`` and its helpers in eaglepatch/hostside/doctor.py), the
module the host runs, imported here.

Each test can fail: a log read whole instead of its ends (or the wrong end), the lines of an earlier launch kept,
a pipe read as a log (reading it would steal the server's output), a model found in the wrong place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from eaglepatch.doctor.facts import LOG_FILTER
from eaglepatch.hostside import doctor as host  # as the host runs it


def test_a_log_is_read_at_its_ends(tmp_path):
    """A 3 MB log (over head + tail): its first and last bytes are read, filtered; the middle is not (its decode
    line is missing); the line cut by the tail's start is dropped."""
    import re

    log = tmp_path / "server.log"
    with open(log, "w") as f:
        f.write("[t] server_args=ServerArgs(model_path='/m')\n")
        f.write("[t] Decode batch, #running-req: 1, accept len: 9.99, cuda graph: True\n")
        f.write(("x" * 99 + "\n") * 15000)
        f.write("[t] Decode batch, #running-req: 2, accept len: 7.77, cuda graph: True\n")  # the middle
        f.write(("x" * 99 + "\n") * 15000)
        f.write("[t] Decode batch, #running-req: 3, accept len: 1.00, cuda graph: False\n")
    size = log.stat().st_size
    assert size > 3_000_000
    lines = host.read_log(str(log), size, re.compile(LOG_FILTER), 1024, 4096, 100)
    assert lines == ["[t] server_args=ServerArgs(model_path='/m')",
                     "[t] Decode batch, #running-req: 1, accept len: 9.99, cuda graph: True",
                     "[t] Decode batch, #running-req: 3, accept len: 1.00, cuda graph: False"]
    xs = host.read_log(str(log), size, re.compile("^x"), 1024, 4096, 10000)
    assert 40 < len(xs) < 60 and set(xs) == {"x" * 99}  # whole lines of both ends only


def test_a_log_is_read_from_its_last_launch(tmp_path):
    """A log that two launches appended to: only the lines from the last server_args line on; at most max_lines
    of them (the last ones, the server_args line kept first)."""
    import re

    log = tmp_path / "server.log"
    log.write_text("[t] server_args=ServerArgs(model_path='/old')\n"
                   "[t] Decode batch, #running-req: 2, accept len: 8.88, cuda graph: True\n"
                   "[t] server_args=ServerArgs(model_path='/new')\n"
                   "[t] Prefill batch, #new-seq: 1, cuda graph: False\n"
                   "[t] Decode batch, #running-req: 3, accept len: 1.00, cuda graph: False\n")
    size = log.stat().st_size
    assert host.read_log(str(log), size, re.compile(LOG_FILTER), 1 << 20, 1 << 20, 100) == [
        "[t] server_args=ServerArgs(model_path='/new')",
        "[t] Decode batch, #running-req: 3, accept len: 1.00, cuda graph: False"]
    assert host.read_log(str(log), size, re.compile("."), 1 << 20, 1 << 20, 2) == [
        "[t] server_args=ServerArgs(model_path='/new')",
        "[t] Decode batch, #running-req: 3, accept len: 1.00, cuda graph: False"]


def test_only_regular_files_are_log_sources(tmp_path):
    """A process whose stdout is a file and stderr a pipe: the file is a source (once, though two processes write
    it), the pipe is named and never read."""
    out = open(tmp_path / "out.log", "w")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=out,
                              stderr=subprocess.PIPE) for _ in range(2)]
    try:
        files, other = host.log_sources([p.pid for p in procs])
        assert [t for _link, t, _size in files] == [str(tmp_path / "out.log")]
        assert other and all(o.startswith("pipe:") for o in other)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        out.close()


def test_model_configs_from_a_folder_or_the_hugging_face_cache(tmp_path):
    """A folder relative to the server's working directory; a repo id found in the server's hub cache (its
    refs/main snapshot); a repo id not cached, and a folder without config.json: an error saying so."""
    (tmp_path / "work" / "models" / "t").mkdir(parents=True)
    (tmp_path / "work" / "models" / "t" / "config.json").write_text('{"hidden_size": 8}')
    got = host.model_config("models/t", str(tmp_path / "work"), {})
    assert got == {"path": str(tmp_path / "work" / "models" / "t" / "config.json"), "text": '{"hidden_size": 8}'}
    repo = tmp_path / "home" / ".cache" / "huggingface" / "hub" / "models--org--draft-3"
    for snap, body in (("old", '{"v": 1}'), ("abc", '{"architectures": ["LlamaForCausalLMEagle3"]}')):
        (repo / "snapshots" / snap).mkdir(parents=True)
        (repo / "snapshots" / snap / "config.json").write_text(body)
        time.sleep(0.01)
    os.utime(repo / "snapshots" / "old", (time.time() + 10, time.time() + 10))  # newer, but not refs/main
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc\n")
    hf = host.model_config("org/draft-3", "/", {"HOME": str(tmp_path / "home")})
    assert json.loads(hf["text"])["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "Hugging Face cache" in host.model_config("org/other", "/", {"HOME": str(tmp_path / "home")})["error"]
    (tmp_path / "empty").mkdir()
    assert "error" in host.model_config(str(tmp_path / "empty"), "/", {})


def test_op_doctor_reads_a_live_process(tmp_path):
    """op_doctor on a process writing sglang-like lines to a file, without a port: its log lines (filtered), no
    server_info asked; nvidia-smi's absence is an answer, not an error."""
    log = tmp_path / "s.log"
    log.write_text("[t] server_args=ServerArgs(tp_size=1)\n[t] hello\n[t] Decode batch, #running-req: 1, "
                   "accept len: 1.00, cuda graph: True\n")
    with open(log, "a") as out:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=out, stderr=out)
    try:
        res = host.op_doctor({"servers": [{"pid": p.pid, "children": [], "port": None, "models": []}],
                                 "filter": LOG_FILTER, "gpus": True})
    finally:
        p.kill()
        p.wait()
    [srv] = res["servers"]
    assert [x["lines"] for x in srv["logs"]] == [["[t] server_args=ServerArgs(tp_size=1)",
                                                 "[t] Decode batch, #running-req: 1, accept len: 1.00, cuda graph: True"]]
    assert "server_info" not in srv and isinstance(res["gpus"], dict)


def _load_server(routes: dict) -> tuple:
    """A local HTTP server answering GET paths (query included) from ``routes`` (path -> (status, JSON)), else 404;
    (server, port, the paths asked, their Authorization headers)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked, auth = [], []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            auth.append(self.headers.get("Authorization"))
            status, doc = routes.get(self.path, (404, {"detail": "Not Found"}))
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1], asked, auth


def test_loads_reads_v1_loads_over_every_dp_rank_with_the_api_key():
    routes = {"/v1/loads?include=core": (200, {"loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1},
                                                         {"dp_rank": 1, "num_running_reqs": 2, "num_waiting_reqs": 0}]}),
              "/get_load": (200, [{"num_reqs": 99}])}
    srv, port, asked, auth = _load_server(routes)
    try:
        got = host.op_loads({"port": port, "api_key": "k", "samples": 3, "interval": 0.01})
    finally:
        srv.shutdown()
    assert got == {"endpoint": "/v1/loads?include=core", "samples": [6, 6, 6], "error": None}
    assert asked == ["/v1/loads?include=core"] * 3 and auth == ["Bearer k"] * 3


def test_loads_falls_back_to_get_load_and_says_when_neither_answers():
    srv, port, asked, _ = _load_server({"/get_load": (200, [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0}])})
    try:
        got = host.op_loads({"port": port, "samples": 2, "interval": 0.01})
    finally:
        srv.shutdown()
    assert got == {"endpoint": "/get_load", "samples": [0, 0], "error": None}
    assert asked == ["/v1/loads?include=core", "/get_load", "/get_load"]
    srv, port, _, _ = _load_server({})
    try:
        got = host.op_loads({"port": port})
    finally:
        srv.shutdown()
    assert got["endpoint"] is None and got["samples"] == [] and got["error"]


def test_loads_of_another_shape_or_refused_are_no_count():
    """A 401 (a key not given), a count that is not a non-negative integer, rows that are not objects: no count, an
    error said (the sweep then notes that it cannot tell, and refuses nothing on it)."""
    for routes in ({"/v1/loads?include=core": (401, {"error": "unauthorized"})},
                   {"/v1/loads?include=core": (200, {"loads": [{"num_running_reqs": -1}]})},
                   {"/v1/loads?include=core": (200, {"loads": [{"num_running_reqs": "3"}]})},
                   {"/v1/loads?include=core": (200, {"loads": ["x"]})},
                   {"/get_load": (200, {"num_reqs": 3})}):
        srv, port, _, _ = _load_server(routes)
        try:
            got = host.op_loads({"port": port, "samples": 2, "interval": 0.01})
        finally:
            srv.shutdown()
        assert got["samples"] == [] and got["error"], (routes, got)
    assert host.requests_in("/v1/loads?include=core", {"loads": [{"num_running_reqs": True}]}) is None
    assert host.requests_in("/get_load", [{"num_reqs": 4}, {"num_reqs": 1}]) == 5
