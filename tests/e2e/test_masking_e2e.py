"""What is printed of a command line, an environment and a server's log (docs/contract.md, issue 41), end to end:
a stand-in server launched with an API key, a model path whose URL carries a password and secrets in its
environment; ``status``, ``doctor`` and a failed ``restart`` (whose error quotes the server's log tail: the
stand-in's own ``argv=[...]`` line, sglang's ``server_args=ServerArgs(... api_key='...')`` line and a URL with a
password and a token) print none of them, in text and JSON, and show where each was masked.

Before issue 41 the restart's error printed the log tail as it was (the API key in the argv and ServerArgs lines,
the URL's password and token), and status, show and doctor printed the model URL's password.
"""

from __future__ import annotations

import json
import secrets
import shutil

import pytest

from safety import make_install, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_status_doctor_and_a_failed_restarts_log_tail_print_no_secret(standins, tmp_path, local_cli):
    cli = local_cli  # conftest.py
    install = make_install(standins, tmp_path / "install", "venv-by-path")
    key, pw, tok = ("sk-test-" + secrets.token_hex(6), "pw-" + secrets.token_hex(6), "tok-" + secrets.token_hex(6))
    pat, db = "ghp_" + secrets.token_hex(6), "db-" + secrets.token_hex(6)
    model = f"https://hf-user:{pw}@models.example/llama"
    port, _proc = up(install, standins, tmp_path / "work", "--api-key", key, "--model-path", model,
                     "--sim-sglang-log", "--speculative-num-draft-tokens", "4", GITHUB_PAT=pat, DB_PASS=db)
    outputs = []
    for args in (("status",), ("status", "--json"), ("show", "--json"), ("doctor",), ("doctor", "--json")):
        r = cli.run(args[0], install.pkg, *args[1:])
        assert r.rc == 0, r
        outputs.append(r.out + r.err)
    status = json.loads(outputs[1])
    (srv,) = [s for s in status["servers"] if s["port"] == port]
    i = srv["argv"].index("--api-key")
    assert srv["argv"][i:i + 4] == ["--api-key", "***", "--model-path", "https://hf-user:***@models.example/llama"]

    # the patched worker no longer imports: the new server writes sglang's start-up line (its key in it, as sglang
    # writes it), a URL with a password and a token, then dies; restart's error quotes the log's tail
    install.worker.write_text(
        "import sys\n"
        f"sys.stderr.write(\"[2025-06-01 10:00:00] server_args=ServerArgs(model_path='{model}', api_key='{key}', "
        f"admin_api_key=None, port={port}, speculative_num_draft_tokens=4)\\n\")\n"
        f"sys.stderr.write('loading from postgres://svc:{pw}@db/x?token={tok}&page=2\\n')\n"
        "raise RuntimeError('broken patch: eagle_worker does not import')\n")
    shutil.rmtree(install.worker.parent / "__pycache__", ignore_errors=True)
    r = cli.run("restart", install.pkg, "--timeout", "60", "--json")
    assert r.rc == 7, r
    err = json.loads(r.out)["error"]
    assert "RuntimeError: broken patch" in err and "RuntimeError: broken patch" in r.err, r
    for text in (err, r.err):
        assert "api_key='***', admin_api_key=None" in text, text
        assert "'--api-key', '***'" in text, text  # the stand-in's argv=[...] line
        assert "postgres://svc:***@db/x?token=***&page=2" in text, text
        assert "speculative_num_draft_tokens=4" in text
    outputs.append(r.out + r.err)

    text = "\n".join(outputs)
    for secret in (key, pw, tok, pat, db):
        assert secret not in text, (secret, text)
    assert "--api-key ***" in text and "hf-user:***@models.example" in text
    assert "--speculative-num-draft-tokens 4" in text
