"""eaglepatch.redact: the one masking rule for command lines and environments, and the escaping of host text."""

from __future__ import annotations

import pytest

from eaglepatch.redact import MASK, is_secret_name, mask_argv, mask_env, shown, shown_argv


@pytest.mark.parametrize("name", ["--api-key", "--admin-api-key", "--hf-token", "--ssl-keyfile-password", "--secret",
                                  "--db-passwd", "--aws-credentials", "--gcp_credential", "HF_TOKEN", "OPENAI_API_KEY",
                                  "--API-KEY"])
def test_secret_names(name):
    """Names that end in key, token (singular), secret, password, passwd, credential(s), in any case, "_" as "-"."""
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["--speculative-num-draft-tokens", "--max-total-tokens", "--ssl-keyfile",
                                  "--tokenizer-path", "--skip-tokenizer-init", "--kt-max-deferred-experts-per-token",
                                  "--bucket-time-to-first-token", "--port", "TOKENIZERS_PARALLELISM", "--", ""])
def test_names_that_are_no_secret(name):
    """Counts of tokens, paths, a measure per token: shown."""
    assert not is_secret_name(name)


def test_mask_argv_hides_the_values_and_nothing_else():
    argv = ["env", "HF_TOKEN=hf_x", "python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--admin-api-key=a",
            "--speculative-num-draft-tokens", "4", "--api-key", "--port", "30000", "--hf-token"]
    assert mask_argv(argv) == ["env", f"HF_TOKEN={MASK}", "python", "-m", "sglang.launch_server", "--api-key", MASK,
                               f"--admin-api-key={MASK}", "--speculative-num-draft-tokens", "4", "--api-key",
                               "--port", "30000", "--hf-token"]
    assert argv[1] == "HF_TOKEN=hf_x"  # a copy: the argv itself is what restarts the server


def test_mask_env():
    assert mask_env({"HF_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "0,1", "MY_SECRET": "s"}) == {
        "HF_TOKEN": MASK, "CUDA_VISIBLE_DEVICES": "0,1", "MY_SECRET": MASK}


def test_shown_escapes_control_characters():
    assert shown("a\nb\rc\td\x1b[31mred\x07\x7f\x9b\u202egnp.exe") == \
        "a\\nb\\rc\\td\\e[31mred\\x07\\x7f\\x9b\\u202egnp.exe"
    assert shown("plain text, ünïcødé, a \\ backslash") == "plain text, ünïcødé, a \\ backslash"
    assert shown("line 1\n\tline 2\x1b", keep="\n\t") == "line 1\n\tline 2\\e"
    assert shown(42) == "42"


def test_shown_argv_masks_then_escapes_each_word():
    assert shown_argv(["python", "--api-key", "sk-1", "--served-model-name", "x\nserver: pid 1: fake"]) == \
        "python --api-key *** --served-model-name x\\nserver: pid 1: fake"
