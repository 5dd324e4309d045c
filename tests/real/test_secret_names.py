"""One masking rule, two copies (eaglepatch/redact.py for what eaglepatch prints, the runtime's own for its log
headers: the runtime runs inside the server without eaglepatch), held equal on every launch option of every pinned
sglang release, as ``eaglepatch.server.flags`` reads them from the release's server_args.py.

For each release: both copies mask exactly the same options, in both forms (``--x V`` and ``--x=V``) and with
underscores; what they mask is the reviewed set of secrets (the API keys, the TLS key file's password), and every
count of tokens (``--speculative-num-draft-tokens``, ``--max-total-tokens``) and every path (``--ssl-keyfile``,
``--tokenizer-path``) is shown.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sglang_releases
from eaglepatch.redact import MASK, is_secret_name, mask_argv
from eaglepatch.server.flags import ServerFlags, resolve_server_flags

pytestmark = pytest.mark.real

RUNTIME = Path(__file__).resolve().parents[2] / "eaglepatch" / "runtime" / "_eaglepatch_runtime.py"
# Every option of the pinned releases that the rule masks, reviewed by hand: each holds a secret.
SECRETS = {"api-key", "admin-api-key", "ssl-keyfile-password"}
# Shown although their names hold a secret word: counts and paths
SHOWN = {"speculative-num-draft-tokens", "max-total-tokens", "max-prefill-tokens", "ssl-keyfile", "tokenizer-path",
         "kt-max-deferred-experts-per-token", "bucket-time-to-first-token", "skip-tokenizer-init"}


def _runtime() -> dict:
    """The runtime module, loaded from its file as a patched server imports it (its exit hook unregistered:
    nothing is timed here); its namespace."""
    import atexit
    import importlib.util

    spec = importlib.util.spec_from_file_location("_eaglepatch_runtime_secret_names", str(RUNTIME))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    atexit.unregister(mod._at_exit)
    return vars(mod)


def _flags(site: Path) -> ServerFlags:
    def read(rel: str) -> str | None:
        path = site / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    flags = resolve_server_flags(read)
    assert flags is not None and flags.complete, site
    return flags


@pytest.fixture(scope="module")
def runtime() -> dict:
    return _runtime()


@pytest.mark.parametrize("version", sglang_releases.PINNED)
def test_both_copies_mask_the_same_options_of_the_release(sglang_release, runtime, version):
    flags = _flags(sglang_release(version))
    masked = set()
    for name in sorted(flags.names):
        for spelling in (f"--{name}", f"--{name.replace('-', '_')}"):
            argv = ["python", "-m", "sglang.launch_server", spelling, "v1", f"{spelling}=v2", "--port", "30000"]
            ours, theirs = mask_argv(argv), runtime["_redacted"](argv)
            assert ours == theirs, (version, spelling, ours, theirs)
            assert runtime["_secret_name"](spelling) == is_secret_name(spelling), (version, spelling)
            if ours[3:6] == [spelling, MASK, f"{spelling}={MASK}"]:
                masked.add(name)
            else:
                assert ours == argv, (version, spelling, ours)  # nothing in between: all or nothing
    print(f"sglang {version}: {len(flags.names)} options, masked: {sorted(masked)}")
    assert masked <= SECRETS, f"sglang {version} masks an option not reviewed as a secret: {masked - SECRETS}"
    assert "api-key" in masked
    for name in SHOWN & flags.names:
        assert name not in masked, (version, name)


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("OPENAI_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("SGLANG_TOKEN", True),
    ("TOKENIZERS_PARALLELISM", False), ("CUDA_VISIBLE_DEVICES", False), ("NCCL_PROTO", False),
    ("HF_HUB_ENABLE_HF_TRANSFER", False), ("MAX_TOKENS", False),
])
def test_both_copies_agree_on_environment_variables(runtime, name, secret):
    """The *_TOKEN / *_KEY variables (and the other secret words) are masked, as a NAME=value word of a command
    line (env's form) too; counts are not."""
    assert is_secret_name(name) is secret and runtime["_secret_name"](name) is secret
    argv = ["env", f"{name}=v", "python", "-m", "sglang.launch_server"]
    assert mask_argv(argv) == runtime["_redacted"](argv) == ["env", f"{name}={MASK if secret else 'v'}", *argv[2:]]
