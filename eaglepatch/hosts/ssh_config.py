"""Resolving an SSH destination the way OpenSSH does: what to connect to, as whom, with which keys, how long to
wait, through which jump hosts, and what to do with the server's host key. Data out; no connection, no paramiko
(except in the fallback), so ``eaglepatch.hosts.ssh`` only applies what this module says.

How: ``ssh -G HOST`` when an OpenSSH client is on PATH. It prints the final configuration of ``ssh HOST`` (the user's
config, then the system's, ``Host`` and ``Match`` blocks, ``Include``, tokens: everything OpenSSH does, done by
OpenSSH) without connecting, in a few milliseconds; one process per hop. What the user gave on eaglepatch's command
line goes to it as ssh's own options, so that it wins over the config as it would for ``ssh``: ``user@`` as ``-l``,
the port as ``-p``, ``-i``, ``-J`` and ``--connect-timeout`` (as ``-o ConnectTimeout=``, rounded up: OpenSSH takes
whole seconds; the value in force is eaglepatch's own). The CLI's defaults are not options: ``connect_timeout=None``
means the config's ``ConnectTimeout``, else ``DEFAULT_CONNECT_TIMEOUT``.

From its output, per hop: ``hostname``, ``user``, ``port``, every ``identityfile`` (``~``, ``%``-tokens and
``${VAR}`` expanded here, as ssh would when it loads them; files that do not exist are skipped, as ssh does),
``identitiesonly``, ``connecttimeout`` (``none``: not set), ``proxyjump``, ``proxycommand`` (tokens expanded; run as
ssh runs it: ``$SHELL -c 'exec COMMAND'``), ``stricthostkeychecking``, ``userknownhostsfile`` (all read; the first is
where a new key is saved), ``globalknownhostsfile`` (read), ``hashknownhosts``, ``hostkeyalias`` (the name the host
key is known under).

Jump hosts: each ``ProxyJump`` hop is resolved with ``ssh -G HOP`` too (its ``user@``/``:port`` as ``-l``/``-p``;
``-i`` and ``--connect-timeout`` apply to every hop, as they always have in eaglepatch). As with OpenSSH, which
reaches ``A,B`` with ``ssh -J A B -W target``, the first hop is reached by its own config (its ``ProxyJump`` or
``ProxyCommand``, recursively) and each later hop through the ones before it (its own ``ProxyJump`` and
``ProxyCommand`` do not apply); a chain that comes back to a host already on it is refused. A hop named after the
host it leads to (``Host *`` / ``ProxyJump bastion`` applied to ``bastion`` itself) is dropped.

``~`` is ``$HOME``, as everywhere in eaglepatch. OpenSSH reads ``~/.ssh/config`` and expands ``~`` from the passwd
entry instead (but globs ``Include ~/...`` with ``$HOME``). The two agree unless ``HOME`` is set to another folder
(tests do; so may ``sudo``); then eaglepatch gives ssh ``-F`` a two-line config, ``Include $HOME/.ssh/config`` then
``Include /etc/ssh/ssh_config`` (the order ssh reads them in), and rebases onto ``$HOME`` the known-hosts paths ssh
printed under the passwd home.

Fallback: when no ``ssh`` is on PATH, or ``ssh -G`` fails (no ``-G`` before OpenSSH 6.8, a config this OpenSSH
refuses, an ``ssh`` that is not OpenSSH), paramiko's ``SSHConfig`` reads ``~/.ssh/config`` then
``/etc/ssh/ssh_config``, with ``Include`` expanded here (globs; relative paths from ``~/.ssh``, or ``/etc/ssh`` in the
system file; nested up to 16 deep as OpenSSH allows); ``Match exec`` runs through invoke. OpenSSH's defaults fill in
what the files do not say. An ``Include`` inside a ``Host``/``Match`` block is inlined (what follows it stays in that
block), which is OpenSSH's conditional inclusion when the block matches; when it does not, OpenSSH skips the whole
file while here its own ``Host`` lines still decide. ``ssh -G`` taking longer than ``SSH_G_TIMEOUT`` (a ``Match exec``
that hangs) is an error, not a fallback: the fallback would run the same command.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import pwd
import re
import shlex
import socket
import subprocess
from typing import Any, Iterable

from eaglepatch import console
from eaglepatch.errors import ConnectionFailed, UsageError
from eaglepatch.hosts.spec import DEFAULT_CONNECT_TIMEOUT, Hop, TargetSpec, parse_jump

#: The longest ``ssh -G`` may take (it does not connect: milliseconds, unless a ``Match exec`` command is slow).
SSH_G_TIMEOUT = 10.0
USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
# OpenSSH's defaults (ssh_config(5)), for the fallback; ssh -G prints them itself.
DEFAULT_IDENTITY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ecdsa_sk", "~/.ssh/id_ed25519",
                          "~/.ssh/id_ed25519_sk", "~/.ssh/id_xmss", "~/.ssh/id_dsa")
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
_MAX_INCLUDE_DEPTH = 16  # OpenSSH's READCONF_MAX_DEPTH
_MAX_JUMP_DEPTH = 16

# StrictHostKeyChecking, as eaglepatch applies it
CHECK_YES = "yes"  # an unknown key is refused (unless --accept-new-host-key)
CHECK_ACCEPT_NEW = "accept-new"  # an unknown key is accepted and saved
CHECK_NO = "no"  # an unknown key is accepted, not saved
_CHECK = {"yes": CHECK_YES, "true": CHECK_YES, "ask": CHECK_YES, "accept-new": CHECK_ACCEPT_NEW,
          "no": CHECK_NO, "false": CHECK_NO, "off": CHECK_NO}


@dataclasses.dataclass(frozen=True)
class HostKeyPolicy:
    """What to do with the host key a server offers, from ``StrictHostKeyChecking``, ``UserKnownHostsFile``,
    ``GlobalKnownHostsFile``, ``HashKnownHosts`` and ``--accept-new-host-key``.

    ``check``:

    - ``"yes"`` (``StrictHostKeyChecking yes``, and ``ask``, OpenSSH's default: eaglepatch never prompts): a key
      that no file knows is refused, unless ``--accept-new-host-key``, which makes it ``"accept-new"``;
    - ``"accept-new"``: an unknown key is accepted and appended to ``save_to`` (hashed with ``hash_names``);
    - ``"no"`` (``no``/``off``): an unknown key is accepted and NOT saved (OpenSSH would save it; eaglepatch does
      not, so that a host re-installed later, the reason one turns checking off, is not then refused as changed).

    Whatever ``check`` says, a key that differs from the one a file knows for that host (a CHANGED key) is always
    refused by eaglepatch, where OpenSSH with ``no`` would connect anyway (with password and forwarding off).
    ``known_hosts``: every file read, the user's then the global ones. ``save_to``: the first ``UserKnownHostsFile``
    (None with ``UserKnownHostsFile none``: nothing is saved). ``alias``: ``HostKeyAlias``: as with OpenSSH, the key
    is looked up under that name alone (not ``[host]:port``, no port added) and a new one saved under it.
    """

    check: str = CHECK_YES
    known_hosts: tuple[str, ...] = ()
    save_to: str | None = None
    hash_names: bool = False
    alias: str | None = None  # HostKeyAlias: the name the key is looked up and saved under, instead of the address


@dataclasses.dataclass(frozen=True)
class ResolvedHop:
    """One SSH connection to make (the target, or a jump host on the way), as the SSH config and the command line
    say together."""

    name: str  # as given: the alias or address of TARGET, or a ProxyJump hop's host
    hostname: str  # what to connect to (HostName)
    user: str
    port: int
    identity_files: tuple[str, ...]  # existing key files, in the order to try them (-i first)
    identities_only: bool  # IdentitiesOnly: the ssh-agent is not asked
    timeout: float  # seconds, for the TCP connect and the SSH handshake
    timeout_from: str  # "--connect-timeout", "ConnectTimeout" or "default"
    proxy_command: str | None  # a command line for paramiko.ProxyCommand, or None
    proxy_jump: tuple[Hop, ...]  # the hop's ProxyJump as resolved (the chain is built by resolve())
    host_keys: HostKeyPolicy
    source: str  # "ssh -G" or "paramiko"

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts names this host: its ``HostKeyAlias``, else ``host``, or ``[host]:port`` on a port other
        than 22."""
        if self.host_keys.alias:
            return self.host_keys.alias
        return self.address_name

    @property
    def address_name(self) -> str:
        """How paramiko looks the host up: ``host``, or ``[host]:port`` on a port other than 22."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve(spec: TargetSpec) -> list[ResolvedHop]:
    """The connections to make for an SSH ``spec``, in order: the jump hosts, then the target (last).

    Raises ``UsageError`` for a config eaglepatch cannot use (a bad ``Port``, ``ProxyJump``, a loop of jump hosts)
    and ``ConnectionFailed`` when ``ssh -G`` hangs past ``SSH_G_TIMEOUT``."""
    if spec.is_local or not spec.host:
        raise ValueError(f"resolve needs an SSH target, not {spec.text!r}")
    resolver = _Resolver(spec)
    try:
        return resolver.chain(Hop(spec.host, spec.user, spec.port), spec.jump, ())
    finally:
        resolver.close()


def find_ssh() -> str | None:
    """The ``ssh`` that a shell would run (the first executable one on PATH), or None."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", "ssh")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def local_user() -> str:
    """The local user's name (OpenSSH's ``%u``; the default remote user)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # no passwd entry (a container's uid)
        return os.environ.get("LOGNAME") or os.environ.get("USER") or str(os.getuid())


# --------------------------------------------------------------------------------------------------------------
# the chain of hops


class _Pending:
    """One ``ssh -G`` under way (or, with ``proc`` None, one hop for the fallback)."""

    def __init__(self, hop: Hop, jump: tuple[Hop, ...] | None, proc: subprocess.Popen | None, why: str = ""):
        self.hop, self.jump, self.proc, self.why = hop, jump, proc, why


class _Resolver:
    def __init__(self, spec: TargetSpec):
        self.spec = spec
        self.home = os.path.expanduser("~")
        try:
            self.pw_home: str | None = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            self.pw_home = None  # ssh itself refuses to run then ("No user exists for uid"): the fallback reads
        self.rebase = bool(self.pw_home) and os.path.realpath(self.home) != os.path.realpath(self.pw_home or "")
        self.ssh = find_ssh()
        self._config_file: str | None = None  # -F for ssh -G when HOME is not the passwd home
        self._fallback: Any = None  # paramiko.SSHConfig, read once

    def close(self) -> None:
        if self._config_file:
            try:
                os.unlink(self._config_file)
            except OSError:
                pass
            self._config_file = None

    def chain(self, hop: Hop, jump: tuple[Hop, ...] | None, seen: tuple[str, ...]) -> list[ResolvedHop]:
        """``hop`` and what it takes to reach it. ``jump``: the ProxyJump in force for it when it is not the
        config's (-J; ``()`` for none)."""
        target = self.finish(self.start(hop, jump))
        if jump is None:  # the config's ProxyJump
            # a hop that is the very destination it leads to (a wildcard ProxyJump applied to the jump host itself):
            # no host is its own jump host. Only the same host AND port AND user: a jump given by address to
            # another port of the same machine (root@127.0.0.1:2222, the form ssh -G prints) is a real hop.
            jumps = tuple(j for j in target.proxy_jump if not _same_destination(j, hop, target))
            seen = seen + (hop.host,)
        else:  # -J: taken as given
            jumps = jump
        if not jumps:
            return [target]
        target = dataclasses.replace(target, proxy_command=None)  # ProxyJump, not ProxyCommand: one way in
        first, rest = jumps[0], jumps[1:]
        # The first hop is reached by its own config, which may name a jump host in turn: a chain of ProxyJump
        # lines that comes back to a host already on its way would never end (ssh would start ssh after ssh).
        if first.host in seen or len(seen) > _MAX_JUMP_DEPTH:
            path = " -> ".join((*seen, first.host))
            raise UsageError(f"the jump hosts of {self.spec.host} go round in a loop ({path}): fix ProxyJump in "
                             "the SSH config, or give -J/--jump")
        # The later hops, each reached through the ones before it: their own ProxyJump/ProxyCommand do not apply.
        # Their ssh -G run while the first hop is resolved.
        later = [self.start(j, ()) for j in rest]
        try:
            head = self.chain(first, None, seen)
        except BaseException:
            for p in later:
                if p.proc is not None:
                    _kill(p.proc)
            raise
        tail = [dataclasses.replace(self.finish(p), proxy_command=None, proxy_jump=()) for p in later]
        return head + tail + [target]

    # ---------------------------------------------------------------------------------------------- one hop

    def start(self, hop: Hop, jump: tuple[Hop, ...] | None) -> _Pending:
        if self.ssh is None:
            return _Pending(hop, jump, None, "no ssh on PATH")
        argv = [self.ssh, "-G"]
        if self.rebase:
            argv += ["-F", self._home_config()]
        if hop.user:
            argv += ["-l", hop.user]
        if hop.port is not None:
            argv += ["-p", str(hop.port)]
        if self.spec.identity:
            argv += ["-i", self.spec.identity]
        if jump is not None:
            argv += ["-J", ",".join(str(j) for j in jump) if jump else "none"]
        if self.spec.connect_timeout is not None:
            argv += ["-o", f"ConnectTimeout={max(1, math.ceil(self.spec.connect_timeout))}"]
        argv += ["--", hop.host]
        try:
            # its own session: a Match exec child that outlives a timeout is killed with it (killpg)
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            return _Pending(hop, jump, None, f"cannot run {self.ssh}: {exc.strerror or exc}")
        return _Pending(hop, jump, proc)

    def finish(self, pending: _Pending) -> ResolvedHop:
        hop = pending.hop
        if pending.proc is not None:
            proc = pending.proc
            try:
                out, err = proc.communicate(timeout=SSH_G_TIMEOUT)
            except subprocess.TimeoutExpired:
                _kill(proc)
                raise ConnectionFailed(
                    f"cannot resolve {hop.host}: 'ssh -G {hop.host}' did not finish within {SSH_G_TIMEOUT:g} s "
                    "(a Match exec command in the SSH config that hangs?)"
                ) from None
            options = _parse_ssh_g(out.decode("utf-8", "replace"))
            if proc.returncode == 0 and options.get("hostname"):
                return self._hop(hop, options, "ssh -G")
            text = " ".join(err.decode("utf-8", "replace").split())[:300]
            pending.why = f"'ssh -G {hop.host}' exited with {proc.returncode}: {text or 'no output'}"
        if os.environ.get("EAGLEPATCH_DEBUG"):
            console.line(f"eaglepatch: {pending.why}; reading the SSH config with paramiko instead")
        return self._hop(hop, self._fallback_options(hop, pending.jump), "paramiko")

    def _home_config(self) -> str:
        """A config for ``ssh -F`` that reads the user config under $HOME, then the system's (ssh alone would read
        the passwd home's)."""
        if self._config_file is None:
            import tempfile

            fd, path = tempfile.mkstemp(prefix="eaglepatch-ssh-", suffix=".conf")
            with os.fdopen(fd, "w") as f:
                f.write(f"# eaglepatch: HOME is not the passwd home: the user config under HOME, then the system's\n"
                        f"Include \"{os.path.join(self.home, '.ssh', 'config')}\"\n"
                        f"Include {SYSTEM_CONFIG}\n")
            self._config_file = path
        return self._config_file

    def _hop(self, hop: Hop, options: dict[str, list[str]], source: str) -> ResolvedHop:
        spec = self.spec

        def first(key: str, default: str | None = None) -> str | None:
            values = options.get(key)
            return values[0] if values else default

        name = hop.host
        hostname = first("hostname") or name
        user = hop.user or first("user") or local_user()
        try:
            port = hop.port or int(first("port") or 22)
            if not 1 <= port <= 65535:
                raise ValueError(f"port {port} is out of range")
        except ValueError as exc:
            raise UsageError(f"bad SSH config for {name}: Port {first('port')!r} ({exc}): fix it") from None

        jump_text = first("proxyjump")
        proxy_jump: tuple[Hop, ...] = ()
        if jump_text and jump_text.lower() != "none":
            try:
                proxy_jump = parse_jump(jump_text)
            except UsageError:
                raise UsageError(
                    f"ProxyJump {jump_text!r} for {name} in the SSH config is not [user@]host[:port][,...]: fix "
                    "it, or give -J/--jump"
                ) from None

        tokens = _Tokens(name, hostname, port, user, self.home, jump_text, first("hostkeyalias"))
        identities: list[str] = []
        for path in options.get("identityfile", []):
            if source == "ssh -G":
                path = tokens.expand(os.path.expanduser(path), env=True)
            path = os.path.expanduser(path)
            if path not in identities and os.path.isfile(path):
                identities.append(path)

        proxy_command = None
        command = first("proxycommand")
        if command and command.lower() != "none":
            if source == "ssh -G":  # paramiko's lookup has expanded them already
                command = tokens.expand(command)
            shell = os.environ.get("SHELL") or "/bin/sh"
            proxy_command = shlex.join([shell, "-c", f"exec {command}"])  # as ssh runs it

        if spec.connect_timeout is not None:
            timeout, timeout_from = float(spec.connect_timeout), "--connect-timeout"
        else:
            configured = (first("connecttimeout") or "none").lower()
            try:
                timeout, timeout_from = float(configured), "ConnectTimeout"
                if not timeout > 0 or math.isinf(timeout):
                    raise ValueError
            except ValueError:  # "none", or a value the fallback could not read: what the CLI would use
                timeout, timeout_from = DEFAULT_CONNECT_TIMEOUT, "default"

        check = _CHECK.get((first("stricthostkeychecking") or "ask").lower(), CHECK_YES)
        if spec.accept_new_host_key:
            check = CHECK_ACCEPT_NEW
        user_files = self._paths(options.get("userknownhostsfile"), DEFAULT_USER_KNOWN_HOSTS)
        global_files = self._paths(options.get("globalknownhostsfile"), DEFAULT_GLOBAL_KNOWN_HOSTS)
        policy = HostKeyPolicy(
            check=check,
            known_hosts=tuple(dict.fromkeys(user_files + global_files)),
            save_to=user_files[0] if user_files else None,
            hash_names=_yes(first("hashknownhosts")),
            alias=first("hostkeyalias") or None,
        )
        return ResolvedHop(
            name=name, hostname=hostname, user=user, port=port, identity_files=tuple(identities),
            identities_only=_yes(first("identitiesonly")), timeout=timeout, timeout_from=timeout_from,
            proxy_command=proxy_command, proxy_jump=proxy_jump, host_keys=policy, source=source,
        )

    def _paths(self, values: list[str] | None, default: tuple[str, ...]) -> list[str]:
        words = " ".join(values).split() if values else list(default)
        if [w.lower() for w in words] == ["none"]:
            return []
        paths = []
        for word in words:
            if self.rebase and self.pw_home and (word == self.pw_home or word.startswith(self.pw_home + "/")):
                word = self.home + word[len(self.pw_home):]  # ssh expanded ~ to the passwd home: ~ is $HOME here
            paths.append(os.path.expanduser(word))
        return paths

    # ---------------------------------------------------------------------------------------------- fallback

    def _fallback_options(self, hop: Hop, jump: tuple[Hop, ...] | None) -> dict[str, list[str]]:
        """paramiko's lookup for ``hop`` in the shape of ssh -G's output, with what ssh -G would have added: the
        command line's options, OpenSSH's defaults."""
        if self._fallback is None:
            self._fallback = read_fallback_config(self.home)
        try:
            found = self._fallback.lookup(hop.host)
        except Exception as exc:  # a Match exec that invoke cannot run, a token paramiko does not know...
            raise UsageError(f"cannot read the SSH config ({USER_CONFIG}, {SYSTEM_CONFIG}) for {hop.host}: {exc}: "
                             "fix it") from exc
        options: dict[str, list[str]] = {}
        for key, value in found.items():
            values = value if isinstance(value, list) else [value]
            options[key.lower()] = [str(v) for v in values]
        identities = ([self.spec.identity] if self.spec.identity else []) + options.get("identityfile", [])
        options["identityfile"] = identities or list(DEFAULT_IDENTITY_FILES)  # ssh adds the defaults only then
        if jump is not None:
            options["proxyjump"] = [",".join(str(j) for j in jump) if jump else "none"]
        elif "proxyjump" in options and "proxycommand" in options:
            del options["proxycommand"]  # which came first is lost in the lookup; ProxyJump wins here
        return options


def read_fallback_config(home: str | None = None) -> Any:
    """``~/.ssh/config`` then ``/etc/ssh/ssh_config`` in one paramiko ``SSHConfig`` (a lookup takes the first value
    found, so the user's file wins, as with OpenSSH), each with its ``Include`` lines replaced by the files they
    name. Raises ``UsageError`` for a file paramiko cannot parse."""
    import paramiko  # only here: ssh -G needs none of it (eaglepatch.hosts.ssh has imported it by now)

    home = home or os.path.expanduser("~")
    config = paramiko.SSHConfig()
    for path, base in ((os.path.join(home, ".ssh", "config"), os.path.join(home, ".ssh")),
                       (SYSTEM_CONFIG, os.path.dirname(SYSTEM_CONFIG))):
        if not os.path.isfile(path):
            continue
        text = expand_includes(path, base)
        try:  # one parse per file: each starts outside any Host block, as with OpenSSH
            config.parse(iter(text.splitlines(keepends=True)))
        except Exception as exc:  # paramiko.ConfigParseError and friends
            raise UsageError(f"cannot read the SSH config ({path}): {exc}: fix it") from exc
    return config


_KEYWORD = r"^\s*([A-Za-z]+)(?:\s*=\s*|\s+)(.*?)\s*$"  # "Keyword value" or "Keyword=value"


def expand_includes(path: str, base: str, depth: int = 0) -> str:
    """The text of the config file ``path`` with each ``Include`` line replaced by the files it names (globs, sorted;
    ``~`` is $HOME; a relative path is taken from ``base``: ``~/.ssh`` for the user's config, ``/etc/ssh`` for the
    system's). After an included file, the ``Host``/``Match`` line in force before it is repeated (``Host *`` at
    the top level), so that what follows the ``Include`` stays in its block, as with OpenSSH. A file that cannot be
    read counts as empty."""
    import glob

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    out: list[str] = []
    header: str | None = None
    for line in lines:
        m = re.match(_KEYWORD, line)
        keyword = m.group(1).lower() if m else ""
        if keyword in ("host", "match"):
            header = line
        if keyword != "include":
            out.append(line)
            continue
        try:
            patterns = shlex.split(m.group(2))  # type: ignore[union-attr]
        except ValueError:
            patterns = m.group(2).split()  # type: ignore[union-attr]
        for pattern in patterns:
            pattern = os.path.expanduser(pattern)
            if not os.path.isabs(pattern):
                pattern = os.path.join(base, pattern)
            for name in sorted(glob.glob(pattern)):
                if depth + 1 > _MAX_INCLUDE_DEPTH:
                    raise UsageError(f"the SSH config's Include lines nest deeper than {_MAX_INCLUDE_DEPTH} "
                                     f"({name}): an Include loop?")
                if os.path.isfile(name):
                    out.append(expand_includes(name, base, depth + 1))
        out.append(header or "Host *")  # back in the block of the Include line (top level: every host)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------------------------
# helpers


def _same_destination(jump: Hop, hop: Hop, target: ResolvedHop) -> bool:
    """Whether the ProxyJump hop ``jump`` names the destination ``hop`` itself (resolved as ``target``): the same
    name (the alias, whose own config gives the same port and user when ``jump`` names none) or the same address
    and port (22 when ``jump`` names none), and the same user when ``jump`` names one."""
    if jump.user is not None and jump.user != target.user:
        return False
    if jump.host == hop.host:
        return jump.port is None or jump.port == target.port
    if jump.host == target.hostname:
        return (jump.port or 22) == target.port
    return False


def _parse_ssh_g(text: str) -> dict[str, list[str]]:
    """``keyword value`` lines (a keyword given more than once, as ``identityfile``, keeps every value)."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value.strip())
    return options


def _yes(value: str | None) -> bool:
    return (value or "").lower() in ("yes", "true")


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for stream in (proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


class _Tokens:
    """OpenSSH's ``%`` tokens (ssh_config(5) TOKENS) for one hop, and ``${VAR}`` where ssh allows it."""

    def __init__(self, name: str, hostname: str, port: int, user: str, home: str, jump: str | None,
                 host_key_alias: str | None):
        self.name, self.hostname, self.port, self.user, self.home = name, hostname, port, user, home
        self.jump = "" if not jump or jump.lower() == "none" else parse_last_jump_host(jump)
        self.alias = host_key_alias or name
        self._table: dict[str, str] | None = None

    def table(self) -> dict[str, str]:
        if self._table is None:
            this = socket.gethostname()
            port = str(self.port)
            self._table = {
                "h": self.hostname, "n": self.name, "p": port, "r": self.user, "d": self.home, "u": local_user(),
                "l": this, "L": this.split(".")[0], "i": str(os.getuid()), "k": self.alias, "j": self.jump,
                "C": hashlib.sha1((this + self.hostname + port + self.user + self.jump).encode()).hexdigest(),
            }
        return self._table

    def expand(self, text: str, env: bool = False) -> str:
        if "%" not in text and not (env and "${" in text):
            return text
        out = []
        i = 0
        while i < len(text):
            c = text[i]
            if c == "%" and i + 1 < len(text):
                token = text[i + 1]
                out.append("%" if token == "%" else self.table().get(token, text[i : i + 2]))
                i += 2
                continue
            if env and text.startswith("${", i):
                end = text.find("}", i)
                if end > 0 and text[i + 2 : end] in os.environ:
                    out.append(os.environ[text[i + 2 : end]])
                    i = end + 1
                    continue
            out.append(c)
            i += 1
        return "".join(out)


def parse_last_jump_host(jump: str) -> str:
    """OpenSSH's ``%j``: the host of the last hop of a ProxyJump value (the one the target is reached from)."""
    last = jump.split(",")[-1].strip()
    if last.startswith("ssh://"):
        last = last[len("ssh://"):].rstrip("/")
    last = last.rpartition("@")[2]
    if last.startswith("["):
        return last[1:].partition("]")[0]
    return last if last.count(":") >= 2 else last.partition(":")[0]


def describe(hops: Iterable[ResolvedHop]) -> str:
    """One line per hop, for EAGLEPATCH_DEBUG and tests: what was resolved, and how."""
    return "\n".join(
        f"{h.name}: {h.user}@{h.hostname}:{h.port} via {h.source}; keys {list(h.identity_files)}"
        f"{' (IdentitiesOnly)' if h.identities_only else ''}; timeout {h.timeout:g} s ({h.timeout_from}); "
        f"host keys {h.host_keys.check}, save to {h.host_keys.save_to}"
        f"{'; ProxyCommand ' + h.proxy_command if h.proxy_command else ''}"
        for h in hops
    )
