"""Recognising an sglang launcher's command line, and reading where it listens.

Pure functions, small hand-written command lines: the scan on the host uses exactly these (``eaglepatch.hostside``:
the modules the host runs, imported here).
"""

from __future__ import annotations

import pytest

from eaglepatch.server import DEFAULT_HOST, DEFAULT_PORT, parse_server_args, probe_address
from eaglepatch.hostside.launchers import launcher_args_index
from eaglepatch.hostside.proc import parse_proc_net

LAUNCHERS = [
    # (argv, index of the first server argument)
    (["python", "-m", "sglang.launch_server", "--port", "1"], 3),
    (["/opt/venv/bin/python3.11", "-m", "sglang.launch_server"], 3),
    (["python3", "-u", "-X", "faulthandler", "-m", "sglang.launch_server", "--tp", "8"], 6),
    (["python3", "-um", "sglang.launch_server", "--port", "2"], 3),
    (["python3", "-msglang.launch_server", "--port", "2"], 2),
    (["pypy3", "-m", "sglang.launch_server"], 3),
    (["python3.13t", "-m", "sglang.launch_server"], 3),
    (["sglang", "serve", "--model-path", "m"], 2),
    (["/usr/local/bin/sglang", "serve"], 2),
    # a console script after the kernel ran its shebang
    (["/venv/bin/python3", "/venv/bin/sglang", "serve", "--port", "3"], 3),
    (["/venv/bin/python3", "-s", "/venv/bin/sglang", "serve"], 4),
    (["python", "/src/sglang/python/sglang/launch_server.py", "--port", "4"], 2),
]

NOT_LAUNCHERS = [
    [],
    ["sh", "-c", "python -m sglang.launch_server --port 1"],  # the shell around it is not the server
    ["timeout", "100", "python", "-m", "sglang.launch_server"],  # a wrapper is not the server: its child is
    ["python", "-m", "sglang.bench_serving", "--port", "1"],
    ["python", "-m", "sglang_router.launch_server"],
    ["python", "-c", "import sglang.launch_server"],
    ["python", "-c", "from multiprocessing.spawn import spawn_main; spawn_main()", "--multiprocessing-fork"],
    ["sglang::scheduler_TP0"],  # a TP rank renamed by setproctitle
    ["sglang", "version"],
    ["/venv/bin/python3", "/venv/bin/sglang", "generate"],
    ["python", "train.py", "-m", "sglang.launch_server"],  # after the script, -m is the script's argument
    ["vim", "-m", "sglang.launch_server"],
]


@pytest.mark.parametrize("argv,index", LAUNCHERS)
def test_launcher_is_recognised_with_where_its_arguments_begin(argv, index):
    assert launcher_args_index(argv) == index


@pytest.mark.parametrize("argv", NOT_LAUNCHERS)
def test_other_processes_are_not_launchers(argv):
    assert launcher_args_index(argv) == -1


@pytest.mark.parametrize(
    "args,port,host",
    [
        ([], DEFAULT_PORT, DEFAULT_HOST),
        (["--model-path", "m", "--port", "30001"], 30001, DEFAULT_HOST),
        (["--port=30002", "--host=0.0.0.0"], 30002, "0.0.0.0"),
        (["--host", "::", "--port", "8000"], 8000, "::"),
        (["--port", "1", "--port", "2"], 2, DEFAULT_HOST),  # argparse: the last one wins
        (["--port", "nope"], DEFAULT_PORT, DEFAULT_HOST),  # the server would not have started with it
        (["--port"], DEFAULT_PORT, DEFAULT_HOST),
        (["--dist-init-addr", "10.0.0.1:5000", "--nccl-port", "4000"], DEFAULT_PORT, DEFAULT_HOST),
    ],
)
def test_port_and_host_come_from_the_server_arguments(args, port, host):
    parsed = parse_server_args(args)
    assert (parsed.port, parsed.host) == (port, host)


def test_api_key_is_read_for_authenticated_probes():
    assert parse_server_args(["--api-key", "s3cret"]).api_key == "s3cret"
    assert parse_server_args(["--api-key=k"]).api_key == "k"
    assert parse_server_args([]).api_key is None


@pytest.mark.parametrize(
    "listen,probe",
    [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "::1"), ("127.0.0.1", "127.0.0.1"), ("10.1.2.3", "10.1.2.3")],
)
def test_wildcard_listen_addresses_are_probed_on_the_loopback(listen, probe):
    assert probe_address(listen) == probe


PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:7530 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:7531 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
"""


def test_listening_port_is_read_from_proc_net_tcp():
    """State 0A is LISTEN; an established connection from or to a port does not hold it."""
    assert parse_proc_net(PROC_NET_TCP, 30000)
    assert not parse_proc_net(PROC_NET_TCP, 30001)
    assert not parse_proc_net(PROC_NET_TCP, 40000)
    assert not parse_proc_net("", 30000)
