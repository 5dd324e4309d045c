"""eaglepatch.redact beyond option names (issue 41): credentials inside any value (a URL's password, secret query
parameters, ``Bearer``), the common secret variable names (``AWS_ACCESS_KEY_ID``, ``DB_PASS``, ``MYSQL_PWD``,
``GITHUB_PAT``), the command line inside a ``bash -c`` word, sglang's ``server_args=ServerArgs(...)`` log line; and
the printers that go through them: a failed restart's log tail, doctor's evidence, status's ``launched``, a sweep
point's label."""

from __future__ import annotations

import pytest

from eaglepatch.hosts.base import CommandResult
from eaglepatch.redact import (
    MASK,
    is_secret_name,
    mask_argv,
    mask_command,
    mask_env,
    mask_text,
    mask_value,
    shown_argv,
)

# sglang's start-up line, as 0.5.x logs it (shortened), with a key, a password of a TLS key file and a model
# fetched through a URL that carries its credentials
SERVER_ARGS = ("[2025-06-01 10:00:00] server_args=ServerArgs(model_path='https://hf-user:hf_pw1@models.example/llama', "
               "tokenizer_path='/models/llama', api_key='sk-live-123', admin_api_key=None, "
               "ssl_keyfile='/etc/k.pem', ssl_keyfile_password=\"tls-pw\", port=30000, "
               "speculative_num_draft_tokens=4, speculative_token_map=None, "
               "dist_init_addr='tcp://10.0.0.1:5000?token=dist-tok', context_length=4096)")


# -- credentials inside values -------------------------------------------------------------------------------------


@pytest.mark.parametrize("url,masked", [
    ("postgres://user:pw@db", "postgres://user:***@db"),
    ("postgres://svc:s3cr3t@db.internal:5432/app?sslmode=require",
     "postgres://svc:***@db.internal:5432/app?sslmode=require"),
    ("https://user:token@host/", "https://user:***@host/"),
    ("redis://:only-a-password@cache:6379/0", "redis://:***@cache:6379/0"),
    ("https://me:p@ss@host/x", "https://me:***@host/x"),  # an '@' in the password: the last one ends it
])
def test_a_urls_password_is_masked_its_user_and_host_kept(url, masked):
    assert mask_value(url) == masked
    assert mask_text(f"connecting to {url} now") == f"connecting to {masked} now"
    assert mask_argv(["tool", "--db", url]) == ["tool", "--db", masked]
    assert mask_argv(["tool", f"--db={url}"]) == ["tool", f"--db={masked}"]


@pytest.mark.parametrize("name", ["token", "access_token", "api_key", "apikey", "key", "secret", "password", "passwd",
                                  "pwd", "sig", "signature", "auth", "credential", "credentials", "TOKEN", "Api_Key",
                                  "X-Amz-Signature", "X-Amz-Credential", "refresh_token", "client_secret"])
def test_secret_query_parameters_are_masked(name):
    url = f"https://h.example/v1/x?page=2&{name}=s3cr3t&max_tokens=5#top"
    assert mask_value(url) == f"https://h.example/v1/x?page=2&{name}={MASK}&max_tokens=5#top"
    assert mask_value(f"https://h.example/x?{name}=s3cr3t") == f"https://h.example/x?{name}={MASK}"


@pytest.mark.parametrize("text,masked", [
    ("Authorization: Bearer eyJhbGciOi.x.y", "Authorization: Bearer ***"),
    ("authorization: Basic dXNlcjpwdw==", "authorization: Basic ***"),
    ("Authorization: ghp_abcdef", "Authorization: ***"),
    ("curl -H 'Authorization: Bearer abc' http://h", "curl -H 'Authorization: Bearer ***' http://h"),
    ("sent Bearer abc123 to the router", "sent Bearer *** to the router"),
    ('{"Authorization": "Bearer abc"}', '{"Authorization": "***"}'),  # a secret name's whole value (mask_text)
])
def test_bearer_and_authorization_credentials_are_masked(text, masked):
    assert mask_text(text) == masked
    assert "abc" not in mask_value(text) and "dXNlcjpwdw" not in mask_value(text)  # whatever the name


def test_a_header_word_of_a_command_line_is_masked():
    argv = ["curl", "-H", "Authorization: Bearer abc123", "-H", "X-Api-Key: k-9", "http://127.0.0.1:30000/generate"]
    assert mask_argv(argv) == ["curl", "-H", "Authorization: Bearer ***", "-H", "X-Api-Key: ***",
                               "http://127.0.0.1:30000/generate"]


@pytest.mark.parametrize("value", [
    "--model-path", "/models/llama", "http://127.0.0.1:30000/generate", "http://[::1]:30000/v1/models",
    "tcp://10.0.0.1:5000", "https://h/x?page=2&max_tokens=5&sort=key", "git@github.com:org/repo.git",
    "Decode batch, #running-req: 1, #token: 64, token usage: 0.00, accept len: 3.10, cuda graph: True, "
    "gen throughput (token/s): 79.09, #queue-req: 0",
    "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00",
    "the token: count is shown", "hf_token_path=/root/.cache/token", "key_order=asc",
])
def test_harmless_values_are_left_as_they_are(value):
    assert mask_text(value) == value
    assert mask_argv(["python", value]) == ["python", value]


def test_masking_twice_is_masking_once():
    for text in (SERVER_ARGS, "postgres://u:p@db ?token=x Bearer y --api-key z DB_PASS=w"):
        once = mask_text(text)
        assert mask_text(once) == once


# -- secret names ---------------------------------------------------------------------------------------------------


SECRET_VARIABLES = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "DB_PASS", "DB_PASSWORD", "MYSQL_PWD", "GITHUB_PAT",
                    "GH_PAT", "GITHUB_TOKEN", "HF_TOKEN", "API_KEY", "OPENAI_API_KEY", "SECRET_KEY_BASE",
                    "AZURE_CLIENT_SECRET", "GOOGLE_APPLICATION_CREDENTIALS", "MY_CREDENTIALS_JSON", "SSH_PASSPHRASE",
                    "PROXY_AUTH", "db_pass"]
# Shown: counts, maps and ids with "token" inside (sglang's), paths, the working folder, an order of keys
HARMLESS_NAMES = ["KEY_ORDER", "PWD", "OLDPWD", "PATH", "TOKENIZERS_PARALLELISM", "HF_HUB_ENABLE_HF_TRANSFER",
                  "MAX_TOKENS", "HF_TOKEN_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_PROTO", "KEYBOARD_LAYOUT", "BYPASS",
                  "--speculative-token-map", "--return-token-ids", "--speculative-num-draft-tokens", "--ssl-keyfile",
                  "--tokenizer-path", "--kt-max-deferred-experts-per-token", "--bucket-time-to-first-token",
                  "--prefill-delayer-max-delay-passes", "--enable-forward-pass-metrics"]


@pytest.mark.parametrize("name", SECRET_VARIABLES)
def test_common_secret_variables_are_masked_in_an_environment_and_a_command_line(name):
    assert is_secret_name(name)
    assert mask_env({name: "v4lue", "CUDA_VISIBLE_DEVICES": "0,1"}) == {name: MASK, "CUDA_VISIBLE_DEVICES": "0,1"}
    assert mask_argv(["env", f"{name}=v4lue", "python", "-m", "sglang.launch_server"]) == [
        "env", f"{name}={MASK}", "python", "-m", "sglang.launch_server"]
    assert mask_text(f"export {name}=v4lue; {name}='v 4' run") == f"export {name}={MASK}; {name}='{MASK}' run"


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_harmless_names_are_shown(name):
    assert not is_secret_name(name)
    assert mask_env({name: "v"}) == {name: "v"}
    word = f"{name}=v" if not name.startswith("--") else name
    assert mask_argv(["env", word, "v"]) == ["env", word, "v"]


@pytest.mark.parametrize("option", ["--api-key", "--admin-api-key", "--ssl-keyfile-password", "--hf-token",
                                    "--db-pass", "--access-key-id", "--github-pat", "--client-secret-value"])
def test_secret_options_are_masked_in_both_forms(option):
    argv = ["python", "-m", "sglang.launch_server", option, "v1", f"{option}=v2", "--port", "30000"]
    assert mask_argv(argv) == ["python", "-m", "sglang.launch_server", option, MASK, f"{option}={MASK}",
                               "--port", "30000"]
    assert mask_text(f"launched with {option} v1 {option}=v2 --port 30000") == \
        f"launched with {option} {MASK} {option}={MASK} --port 30000"


def test_an_environment_value_keeps_its_name_but_loses_its_credentials():
    env = {"DATABASE_URL": "postgres://app:pw@db/app", "HTTPS_PROXY": "http://me:pw@proxy:3128",
           "HF_ENDPOINT": "https://mirror.example", "SGLANG_ARGS": "--api-key sk-1 --tp 2"}
    assert mask_env(env) == {"DATABASE_URL": "postgres://app:***@db/app", "HTTPS_PROXY": "http://me:***@proxy:3128",
                             "HF_ENDPOINT": "https://mirror.example", "SGLANG_ARGS": "--api-key *** --tp 2"}


# -- a shell's -c word, a command given as one string -----------------------------------------------------------------


def test_the_command_line_of_a_bash_c_word_is_masked_by_the_same_rule():
    inner = ("cd /srv && AWS_SECRET_ACCESS_KEY=abc DB_PASS='x y' exec python -m sglang.launch_server "
             "--api-key sk-1 --model-path /models/llama --db postgres://u:pw@db/x --port 30000")
    out = mask_argv(["/bin/bash", "-c", inner])
    assert out[:2] == ["/bin/bash", "-c"]
    assert out[2] == ("cd /srv && AWS_SECRET_ACCESS_KEY=*** DB_PASS=*** exec python -m sglang.launch_server "
                      "--api-key *** --model-path /models/llama --db postgres://u:***@db/x --port 30000")
    for secret in ("abc", "x y", "sk-1", ":pw@"):
        assert secret not in shown_argv(["/bin/bash", "-c", inner])


@pytest.mark.parametrize("shell", [["sh", "-c"], ["bash", "-lc"], ["/usr/bin/env", "bash", "-o", "pipefail", "-ec"],
                                   ["su", "svc", "-c"]])
def test_every_shell_and_c_spelling(shell):
    out = mask_argv([*shell, "HF_TOKEN=hf_x python -m sglang.launch_server --api-key=sk-1"])
    assert out[-1] == "HF_TOKEN=*** python -m sglang.launch_server --api-key=***"


def test_a_nested_shell_and_one_that_does_not_parse():
    nested = mask_argv(["sh", "-c", "bash -c 'python -m sglang.launch_server --api-key sk-1'"])
    assert "sk-1" not in " ".join(nested) and "--api-key ***" in nested[2]
    # an open quote: shlex refuses it, the raw text is masked
    broken = mask_argv(["sh", "-c", "python --api-key 'sk-1 --port 1"])
    assert broken[2] == "python --api-key '***' --port 1"


def test_a_command_string_without_secrets_is_left_exactly_as_given():
    cmd = "kill 100; while kill -0 100; do sleep 0.1; done; cd '/a b' && nohup python -m sglang.launch_server &"
    assert mask_command(cmd) == cmd
    assert mask_command("docker restart sglang --env HF_TOKEN=hf_x") == "docker restart sglang --env HF_TOKEN=***"


def test_the_words_after_bash_c_are_not_its_command_line():
    """Only the word right after -c is a command line; python's -c code is masked as text."""
    argv = ["python", "-c", "import os; print(1)", "--port", "30000"]
    assert mask_argv(argv) == argv


# -- sglang's server_args line -------------------------------------------------------------------------------------


def test_the_server_args_line_has_its_secret_fields_and_credentials_masked():
    out = mask_text(SERVER_ARGS)
    for secret in ("sk-live-123", "tls-pw", "hf_pw1", "dist-tok"):
        assert secret not in out
    assert "api_key='***'" in out and 'ssl_keyfile_password="***"' in out
    assert "admin_api_key=None" in out  # unset: shown as such
    assert "model_path='https://hf-user:***@models.example/llama'" in out
    assert "dist_init_addr='tcp://10.0.0.1:5000?token=***'" in out
    for kept in ("tokenizer_path='/models/llama'", "ssl_keyfile='/etc/k.pem'", "port=30000",
                 "speculative_num_draft_tokens=4", "speculative_token_map=None", "context_length=4096)"):
        assert kept in out
    # a field's bare value (not a repr'd string) ends at its comma; the first field is found inside the value
    # of server_args=
    assert mask_text("server_args=ServerArgs(api_key=sk-1, port=1)") == "server_args=ServerArgs(api_key=***, port=1)"
    assert mask_text("server_args=ServerArgs(api_key='sk-1', port=1)") == \
        "server_args=ServerArgs(api_key='***', port=1)"
    assert mask_text("error: HF_TOKEN=hf_x rejected") == "error: HF_TOKEN=*** rejected"
    assert mask_text("--note 'then --api-key sk-1' --port 1") == "--note 'then --api-key ***' --port 1"
    # a launcher that logs its argv as a list (the stand-in's "argv=[...]"), in Python's repr and in JSON
    assert mask_text("argv=['python', '--api-key', 'sk 1', '--port', '1', '--hf-token=abc', '--db-pass', '--x']") == \
        "argv=['python', '--api-key', '***', '--port', '1', '--hf-token=***', '--db-pass', '--x']"
    assert mask_text('["--api-key", "sk-1", "--x"]') == '["--api-key", "***", "--x"]'
    # and in a tail of several lines, each line stays one
    tail = "loading\n" + SERVER_ARGS + "\nTraceback (most recent call last):\nRuntimeError: broken"
    assert mask_text(tail).splitlines()[1] == out and len(mask_text(tail).splitlines()) == 4


# -- the printers --------------------------------------------------------------------------------------------------


class _Host:
    """Just enough of a host for a restart command that fails: its log tail and its stderr."""

    name = "fake"
    is_local = False

    def __init__(self, tail: list[str], stderr: bytes = b"") -> None:
        self.agents, self.tail, self.stderr, self.ran = self, tail, stderr, []

    def call(self, python, program, payload, timeout=None):
        assert payload["op"] == "tail"
        return {"lines": self.tail}

    def run(self, argv, **_kw):
        self.ran.append(list(argv))
        return CommandResult(1, b"", self.stderr)

    def stat(self, path):
        return None


def test_a_failed_restart_returns_and_says_its_log_tail_masked():
    from eaglepatch.server import RestartOptions, restart

    host = _Host([SERVER_ARGS, "RuntimeError: cannot reach postgres://svc:pw9@db/x"], b"error: HF_TOKEN=hf_x rejected")
    lines: list[str] = []
    cmd = "HF_TOKEN=hf_x docker restart sglang"
    r = restart(host, options=RestartOptions(restart_cmd=cmd), progress=lines.append)
    assert not r.ready
    text = "\n".join([*lines, r.message, r.log_tail, str(r.to_json())])
    for secret in ("sk-live-123", "tls-pw", "hf_pw1", "pw9", "hf_x"):
        assert secret not in text, secret
    assert "api_key='***'" in r.log_tail and r.to_json()["log_tail"] == r.log_tail
    assert "running the restart command: HF_TOKEN=*** docker restart sglang" in lines[0]
    assert host.ran[0][-1] == cmd  # what runs is the command itself


def test_doctor_masks_the_log_lines_and_texts_it_quotes():
    from eaglepatch.doctor.collect import document
    from eaglepatch.doctor.facts import evidence
    from eaglepatch.doctor.finding import Finding
    from eaglepatch.doctor.render import render
    from eaglepatch.server.process import ServerProcess

    argv = ["python", "-m", "sglang.launch_server", "--model-path", "https://u:pw7@h/m", "--api-key", "sk-live-123"]
    srv = ServerProcess(pid=1, argv=argv, cwd="/", env={}, exe=None, port=30000)
    f = Finding("x", "info", "a finding", (evidence("server-log", "speculative_num_steps=3 in the server_args line",
                                                    line=SERVER_ARGS),), "next: see https://u:pw7@h/m")
    doc = document("gpu1", "0.5.16", srv, [f], {"target_config": "unavailable: not found (https://u:pw7@h/m)"})
    for out in (str(doc), render(doc)):
        for secret in ("sk-live-123", "tls-pw", "hf_pw1", "pw7"):
            assert secret not in out, secret
    ev = doc["findings"][0]["evidence"][0]
    assert "api_key='***'" in ev["line"] and ev["text"] == "speculative_num_steps=3 in the server_args line"


def test_status_says_how_a_server_was_launched_with_its_secrets_masked():
    from eaglepatch.server.process import ServerProcess

    # what comes before sglang's own arguments (the interpreter's options) is shown as it was launched
    argv = ["/opt/venv/bin/python", "-X", "pycache_prefix=https://u:pw9@cache/x", "-m", "sglang.launch_server",
            "--api-key", "sk-1"]
    srv = ServerProcess(pid=1, argv=argv, cwd="/", env={}, exe=None, port=30000, launcher="/usr/bin/python3.11")
    launched = srv.describe_launch()
    assert "pw9" not in launched and "sk-1" not in launched
    assert launched == ("/opt/venv/bin/python -X pycache_prefix=https://u:***@cache/x -m sglang.launch_server "
                        "(/opt/venv/bin/python is /usr/bin/python3.11)")


def test_a_sweep_points_label_and_json_mask_names_and_values():
    from eaglepatch.tuning.sweep import Point

    p = Point(flags=(("speculative-num-steps", "3"), ("db", "postgres://u:pw@db/x")),
              env=(("GITHUB_PAT", "ghp_x"), ("NCCL_PROTO", "LL")))
    assert p.label == "speculative-num-steps=3 db=postgres://u:***@db/x GITHUB_PAT=*** NCCL_PROTO=LL"
    assert p.to_json() == {"flags": {"speculative-num-steps": "3", "db": "postgres://u:***@db/x"},
                           "env": {"GITHUB_PAT": MASK, "NCCL_PROTO": "LL"}}
