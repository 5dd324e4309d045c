"""What may be shown of text that came from a host: secrets masked, control characters escaped.

One rule for every command that prints a server's command line, environment or log (status, show, apply, restart,
sweep, bench, doctor; text and JSON alike), one function per kind of text: ``mask_argv`` (a command line as its
words), ``mask_command`` (a command line as one shell string: ``--restart-cmd``, a ``bash -c`` word), ``mask_env``
(an environment) and ``mask_text`` (free text: a server's log line or tail, sglang's ``server_args=ServerArgs(...)``
line included). ``mask_value`` is the part every one of them applies to any value: credentials inside it. The
runtime keeps its own copy of the name rule for its run header (it runs inside the server without eaglepatch);
tests/real/test_secret_names.py holds the two equal on the option names of every pinned sglang release.

- a secret name: an option or environment variable (or a field, a query parameter) is a secret when its name,
  lower-cased with ``_`` read as ``-``, ends in ``key``, ``token``, ``secret``, ``password``, ``passwd``,
  ``credential`` or ``credentials`` (``--api-key``, ``--admin-api-key``, ``--hf-token``, ``HF_TOKEN``,
  ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY``), unless it ends in ``-per-token`` or ``-first-token`` (a measure
  per token); when its last word is ``pass``, ``passphrase``, ``auth`` or ``authorization`` (``DB_PASS``), its last
  word ``pwd`` or ``pat`` after another word (``MYSQL_PWD``, ``GITHUB_PAT``; ``PWD`` and ``OLDPWD``, the working
  folder, are shown), its last words ``key-id`` (``AWS_ACCESS_KEY_ID``), or when ``secret(s)`` or
  ``credential(s)`` is one of its words (``SECRET_KEY_BASE``). ``token`` counts only last: sglang names counts and
  maps with it inside (``--speculative-num-draft-tokens``, ``--speculative-token-map``, ``--return-token-ids``), and
  ``KEY_ORDER``, ``--ssl-keyfile``, ``TOKENIZERS_PARALLELISM``, ``PATH`` are shown;
- its value is replaced by ``***``: ``--api-key sk-1`` and ``--api-key=sk-1`` in a command line, ``HF_TOKEN=x``
  as a command-line word (``env HF_TOKEN=x python ...``) and in an environment, ``api_key='sk-1'`` in
  sglang's ``server_args=ServerArgs(...)`` line (``api_key='***'``; ``None`` is shown), ``"api_key": "x"`` in JSON;
- credentials inside any value: the password of a URL (``postgres://user:***@db``, user and host kept), a query
  parameter with a secret name or ``sig``, ``signature``, ``pwd`` (``?token=***``, ``&X-Amz-Signature=***``), the
  credential of ``Authorization: Bearer ***`` / ``Bearer ***``;
- the command line of a shell's ``-c`` word (``bash -c "..."``, ``sh -lc '...'``) is masked by the same rule, word
  by word (``shlex``); one that does not parse is masked as free text.

Everything a host sends is data from a stranger (docs/safety.md): ``shown`` escapes the control characters of such
text before it reaches a terminal, so a newline or an escape sequence in a process's argv, a path or a log line
cannot forge a line of eaglepatch's output or drive the terminal.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Mapping, Sequence

MASK = "***"
SECRET_SUFFIXES = ("key", "token", "secret", "password", "passwd", "credential", "credentials")
# ...but not a measure per token: sglang's --kt-max-deferred-experts-per-token (a count) and
# --bucket-time-to-first-token (histogram buckets) end in "token" and hold no secret
NOT_SECRET_SUFFIXES = ("-per-token", "-first-token")
# a secret as the name's last word (DB_PASS, --proxy-auth); "pwd" and "pat" only after another word (MYSQL_PWD,
# GITHUB_PAT: PWD and OLDPWD are the working folder)
SECRET_LAST_WORDS = ("pass", "passphrase", "auth", "authorization")
SECRET_LAST_AFTER_ANOTHER = ("pwd", "pat")
# a secret wherever it stands among the name's words (SECRET_KEY_BASE, AWS_SECRET_ACCESS_KEY)
SECRET_WORDS = ("secret", "secrets", "credential", "credentials")
# query parameters that hold a secret although their names are none of the above (?sig=, ?pwd=)
SECRET_PARAMS = ("sig", "signature", "pwd", "pat")
# programs whose -c word is a command line (bash -c "...", su -c '...')
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox", "su", "runuser"})

# NAME=value as one command-line word (env(1)'s form), NAME an environment variable's name
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=")
_SHELL_C = re.compile(r"^-[A-Za-z]*c[A-Za-z]*$")  # -c, -lc, -ec
# a quoted or bare value in free text (a bare one ends at blanks, quotes and shell operators; one after a quote
# that never closes is bare)
_VALUE = r"""(?P<val>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|['"]?[^\s;&|'"]+)"""
# --name value / --name=value in free text, and '--name', 'value' in a list's repr (a launcher that logs its argv)
_OPTION = re.compile(r"""(?<![\w-])(?P<name>--[A-Za-z0-9][\w.-]*)(?P<sep>=|[ \t]+(?!--)|['"],[ \t]*(?=['"](?!--)))"""
                     + _VALUE)
# name=value, name: value, 'name': value, "name"= value (sglang's ServerArgs repr, shell, JSON, YAML, headers); a
# URL's ?name=value is _QUERY's
_NAMED = re.compile(r"""(?<![\w#.\-/?&])(?P<q>["']?)(?P<name>[A-Za-z_][\w.-]*)(?P=q)(?P<sep>[ \t]*[=:][ \t]*)"""
                    + _VALUE)
_URL_PASSWORD = re.compile(r"""(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'"]*:)(?P<pw>[^\s/?#'"]+)@""")
_QUERY = re.compile(r"""(?P<pre>[?&;](?P<name>[A-Za-z0-9_.\-\[\]]+)=)(?P<val>[^&#\s'"]+)""")
_AUTHORIZATION = re.compile(r"""(?i)(?P<pre>\b(?:proxy-)?authorization["']?[ \t]*[:=][ \t]*["']?"""
                            r"""(?:[A-Za-z]+[ \t]+)?)(?P<val>[^\s'",;]+)""")
_BEARER = re.compile(r"""(?i)(?P<pre>\bbearer[ \t]+)(?P<val>[^\s'",;]+)""")
# what a value left as it is says: unset, not a secret
_UNSET = frozenset({"None", "null", "''", '""', MASK, f"'{MASK}'", f'"{MASK}"'})
# words of a command line shown bare when it is put back together (others are quoted)
_BARE = re.compile(r"[\w@%+=:,./*~^!#$;&|<>()-]+")
# C0 controls, DEL, C1 controls, and the Unicode controls that reorder or hide text on a terminal
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_NAMED_CONTROL = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def is_secret_name(name: str) -> bool:
    """Whether an option (``--api-key``), environment variable (``HF_TOKEN``, ``DB_PASS``) or field holds a secret:
    see the module's rule (its name without leading dashes, lower-cased, ``_`` read as ``-``)."""
    norm = name.lstrip("-").lower().replace("_", "-")
    if not norm or norm.endswith(NOT_SECRET_SUFFIXES):
        return False
    if norm.endswith(SECRET_SUFFIXES):
        return True
    words = [w for w in re.split(r"[-.]", norm) if w]
    if not words:
        return False
    if words[-1] in SECRET_LAST_WORDS or words[-2:] == ["key", "id"]:
        return True
    if len(words) > 1 and words[-1] in SECRET_LAST_AFTER_ANOTHER:
        return True
    return any(w in SECRET_WORDS for w in words)


def _secret_param(name: str) -> bool:
    """A URL query parameter that holds a secret (``token``, ``api_key``, ``X-Amz-Signature``, ``sig``)."""
    last = re.split(r"[-_.]", name.lower())[-1]
    return is_secret_name(name) or name.lower() in SECRET_PARAMS or last in SECRET_PARAMS


def _hidden(value: str) -> str:
    """``value`` (quoted or bare, as ``_VALUE`` matched it) replaced by ``***``, its quotes kept; a bare one keeps
    the ``,`` and ``)`` that end a repr's field (``api_key=x, ``); an unset value (``None``) is left as it is."""
    if value in _UNSET:
        return value
    if value[:1] in "'\"":
        return value[0] + MASK + value[0]
    body = value.rstrip(",)]}")
    if body in _UNSET:
        return value
    return MASK + value[len(body):]


def mask_value(text: str) -> str:
    """``text`` with the credentials inside it masked: a URL's password (``scheme://user:***@host``), secret query
    parameters (``?token=***``), the credential of an ``Authorization`` header and of ``Bearer X``."""
    if not isinstance(text, str):
        return text
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m.group("pre") + MASK + "@", text)
    if "=" in text:
        text = _QUERY.sub(lambda m: m.group("pre") + MASK if _secret_param(m.group("name")) else m.group(0), text)
    lower = text.lower()
    if "authorization" in lower:
        text = _AUTHORIZATION.sub(lambda m: m.group("pre") + MASK, text)
    if "bearer" in lower:
        text = _BEARER.sub(lambda m: m.group("pre") + MASK, text)
    return text


def _named(m: re.Match[str]) -> str | None:
    name, sep = m.group("name"), m.group("sep")
    # "name: value" only for a quoted name or one of several words (JSON, X-Api-Key: ...), never sglang's
    # "#token: 512" or a sentence's "token: ..."
    if ":" in sep and not m.group("q") and not re.search(r"[-_.]", name):
        return None
    if not is_secret_name(name):
        return None
    return m.group(0)[: m.start("val") - m.start()] + _hidden(m.group("val"))


def _option(m: re.Match[str]) -> str | None:
    if not is_secret_name(m.group("name")):
        return None
    return m.group("name") + m.group("sep") + _hidden(m.group("val"))


def _each(pattern: re.Pattern[str], replace: Any, text: str) -> str:
    """``pattern.sub(replace, text)``, but a match that ``replace`` declines (None: not a secret) is not consumed
    past its name: its value may hold a secret of its own (``server_args=ServerArgs(api_key='...')``,
    ``error: HF_TOKEN=...``)."""
    out: list[str] = []
    done = at = 0
    while True:
        m = pattern.search(text, at)
        if m is None:
            break
        new = replace(m)
        if new is None:
            at = m.end("name")
            continue
        out += [text[done:m.start()], new]
        done = at = m.end()
    return "".join(out) + text[done:] if out else text


def mask_text(text: str) -> str:
    """Free text from a host (a server's log line or tail, sglang's ``server_args=ServerArgs(...)`` line, a
    command's output) with every secret masked: the values of secret options (``--api-key ***``) and of secret
    names (``api_key='***'``, ``HF_TOKEN=***``, ``"api_key": "***"``), and credentials inside any value
    (``mask_value``). Lines stay lines; nothing else changes."""
    if not isinstance(text, str) or not text:
        return text
    if "--" in text:
        text = _each(_OPTION, _option, text)
    if "=" in text or ":" in text:
        text = _each(_NAMED, _named, text)
    return mask_value(text)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of every secret option (``--api-key V``, ``--api-key=V``) and of every secret
    ``NAME=V`` word replaced by ``***``, a shell's ``-c`` command line masked by ``mask_command``, and every other
    word by ``mask_text`` (credentials inside it); returns a new list, ``argv`` is left as it is."""
    out: list[str] = []
    hide = shell = script = False
    for a in argv:
        if hide and not a.startswith("--"):
            out.append(MASK)
            hide = False
            continue
        hide = False
        if script:  # the command line of bash -c
            script = False
            out.append(mask_command(a))
            continue
        if a.startswith("--"):
            name, eq, _value = a.partition("=")
            if is_secret_name(name):
                hide = not eq  # its value is the next word
                out.append(name + "=" + MASK if eq else a)
                continue
        else:
            m = _ASSIGNMENT.match(a)
            if m and is_secret_name(m.group(1)):
                out.append(m.group(0) + MASK)
                continue
            if shell and _SHELL_C.match(a):
                script = True
            elif a.rsplit("/", 1)[-1] in SHELLS:
                shell = True
        out.append(mask_text(a))
    return out


def _word(w: str) -> str:
    """One word of a command line put back together for people: bare when plain, else shell-quoted."""
    return w if _BARE.fullmatch(w) else shlex.quote(w)


def mask_command(cmd: str) -> str:
    """A command line given as one shell string (``--restart-cmd``, the word after ``bash -c``) masked as
    ``mask_argv`` masks its words (``shlex``); as it was when nothing in it is secret; one that does not parse
    (an open quote) is masked as free text (``mask_text``)."""
    try:
        words = shlex.split(cmd)
    except ValueError:
        return mask_text(cmd)
    masked = mask_argv(words)
    if masked == words:
        return mask_text(cmd)
    return " ".join(_word(w) for w in masked)


def mask_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """``env`` with the value of every secret variable replaced by ``***`` and credentials inside the others'
    masked (``mask_text``); returns a new dict."""
    return {k: (MASK if is_secret_name(k) else mask_text(v)) for k, v in env.items()}


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    named = _NAMED_CONTROL.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: object, keep: str = "") -> str:
    """``text`` (``str()`` of it) with its control characters escaped (``\\n``, ``\\e``, ``\\x07``, ``\\u202e``),
    but those in ``keep`` (e.g. ``"\\n\\t"`` for a block of lines); backslashes are left as they are."""
    s = text if isinstance(text, str) else str(text)
    if not _CONTROL.search(s):
        return s
    if keep:  # one pass (a report's table runs to megabytes: never a list of its characters)
        return _CONTROL.sub(lambda m: m.group(0) if m.group(0) in keep else _escape(m), s)
    return _CONTROL.sub(_escape, s)


def shown_argv(argv: Sequence[str]) -> str:
    """A command line for people: secrets masked, each word's control characters escaped, words joined by
    spaces."""
    return " ".join(shown(a) for a in mask_argv(argv))
