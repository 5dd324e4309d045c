"""Host keys: checking a server's key against the known-hosts files, and saving a new one.

A hop's ``ssh_config.HostKeyPolicy`` says what to do with a key that no loaded file has: refuse it
(``StrictHostKeyChecking yes``/``ask``), or accept it and save it to the first ``UserKnownHostsFile``
(``accept-new``, or ``--accept-new-host-key``), or accept it and not save it (``no``); a changed key is always
refused (paramiko raises ``BadHostKeyException`` before any policy is asked). The same for every jump host.
"""

from __future__ import annotations

import base64
import hashlib
import os

from eaglepatch.hosts.paramiko_import import paramiko
from eaglepatch.hosts.ssh_config import CHECK_ACCEPT_NEW, CHECK_YES, HostKeyPolicy


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class UnknownHostKey(Exception):
    """A host key that no known-hosts file has, refused (``StrictHostKeyChecking yes``/``ask``)."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """A ``HostKeyPolicy`` applied: paramiko asks it about a key that no loaded known-hosts file has for the host.

    ``check`` "yes": refused; "accept-new": accepted, appended to ``save_to``; "no": accepted for this connection
    only. paramiko calls this only for a host that has no key at all in the loaded files; a key that differs from a
    known one raises ``BadHostKeyException`` before any policy is asked, so a changed key is never accepted.
    """

    def __init__(self, policy: HostKeyPolicy):
        self.policy = policy

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        policy = self.policy
        if policy.check == CHECK_YES:
            raise UnknownHostKey(hostname, key)
        if policy.check == CHECK_ACCEPT_NEW and policy.save_to:
            # with HostKeyAlias the key is saved under the alias alone, as OpenSSH saves it
            append_known_host(policy.save_to, policy.alias or hostname, key, hashed=policy.hash_names)
        client.get_host_keys().add(hostname, key.get_name(), key)


def load_known_hosts(client: paramiko.SSHClient, path: str, alias: str | None = None,
                     address: str | None = None) -> None:
    """Add the entries of a known_hosts file to ``client``, skipping lines paramiko cannot read (as OpenSSH does,
    where paramiko's own loader would give up on the whole file). ``@cert-authority``/``@revoked`` lines are
    skipped too (paramiko has no use for them). With ``alias`` (HostKeyAlias), only the keys known under the alias
    are taken, as the keys of ``address`` (the name paramiko looks up): OpenSSH then looks up the alias alone."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    keys = client.get_host_keys()
    if alias is not None and address is not None:
        known = paramiko.HostKeys()
        _read_known_lines(known, lines)
        for keytype, key in (known.lookup(alias) or {}).items():  # lookup matches hashed names too
            keys.add(address, keytype, key)
        return
    _read_known_lines(keys, lines)


def _read_known_lines(keys: paramiko.HostKeys, lines: list[str]) -> None:
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", "@")):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception:
            continue
        if entry is None:
            continue
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)


def append_known_host(path: str, hostname: str, key: paramiko.PKey, hashed: bool = False) -> None:
    """Append ``hostname keytype base64`` to a known_hosts file (``[host]:port`` names as given), creating its
    directory with mode 0700 and the file with 0600 when missing."""
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
    name = paramiko.HostKeys.hash_host(hostname) if hashed else hostname
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as f:
        if f.tell() > 0:
            with open(path, "rb") as r:  # keep one entry per line if the file lacks a final newline
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write("\n")
        f.write(line)
