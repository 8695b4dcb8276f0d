"""No path from a cell to host services (issue 26).

A unix socket at a host path (``/run/docker.sock`` is root on the host) is not covered by
read-only mounts or the network namespace, and ``AF_VSOCK`` reaches the hypervisor. Two
protections, each tested here through real episodes: the seccomp filter allows only the socket
families cells need (AF_UNIX, AF_INET, AF_INET6), and every top-level folder outside the
system's (/run, /var, /home, /root, /srv, /opt, /mnt, /work...) is an empty read-only tmpfs in
the cells' view, with only the interpreter's folders bound back. Socket pairs and
``multiprocessing`` inside the cell keep working.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import skyrl_gym

from tests.conftest import code, qa_extras
from tools.tree import remove_tree

PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
FAMILIES = {
    "netlink": 16,
    "vsock": 40,
    "packet": 17,
    "alg": 38,
    "bluetooth": 31,
    "xdp": 44,
    "unspec": 0,
    "ax25": 3,
}


@pytest.fixture
def env(workspace_root: Path):
    e = skyrl_gym.make(
        "deepanalyze",
        env_config={"workspace_root": str(workspace_root), "executor": {"timeout_s": 20}},
        extras=qa_extras(),
    )
    e.init(PROMPT)
    yield e
    e.close()


def run(env, src: str) -> tuple[str, str]:
    out = env.step(code(src))
    return out["metadata"]["exec"]["status"], out["observations"][0]["content"]


def test_socket_families_outside_the_allowlist_are_refused(env):
    if env.kernel.sandbox.get("seccomp") != "on":
        pytest.skip("needs the seccomp filter (libseccomp)")
    src = "import socket, ctypes\n"
    for name, family in FAMILIES.items():
        src += (
            f"try:\n    socket.socket({family}, socket.SOCK_DGRAM).close()\n    print('HIT {name}')\n"
            f"except OSError as e:\n    print('refused {name}', e.errno)\n"
        )
    # the family in the low 32 bits, junk above: the kernel reads an int, the filter 64 bits
    src += (
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.syscall(41, ctypes.c_long((1 << 33) | 16), 2, 0)\n"
        "print('HIT raw' if fd >= 0 else 'refused raw', ctypes.get_errno())\n"
    )
    status, text = run(env, src)
    assert status == "ok" and "HIT" not in text, text
    for name in [*FAMILIES, "raw"]:
        assert f"refused {name} 97" in text  # EAFNOSUPPORT
    assert run(env, "print('still here')")[0] == "ok"


def test_socket_pairs_and_multiprocessing_keep_working(env):
    src = (
        "import socket, os, threading, multiprocessing as mp\n"
        "a, b = socket.socketpair()\na.send(b'x')\nprint('pair', b.recv(1))\n"
        "q = mp.Queue()\np = mp.Process(target=q.put, args=(41,))\np.start()\n"
        "print('queue', q.get(timeout=15))\n"
        "p.join()\n"
        "with mp.Pool(2) as pool:\n    print('pool', pool.map(abs, [-1, -2]))\n"
        "from multiprocessing.connection import Listener, Client\n"
        "path = os.path.join(os.getcwd(), 'l.sock')\n"
        "with Listener(path) as listener:\n"
        "    t = threading.Thread(target=lambda: Client(path).send('hi'))\n    t.start()\n"
        "    print('listener', listener.accept().recv())\n    t.join()\n"
        "v4, v6 = socket.socket(socket.AF_INET), socket.socket(socket.AF_INET6)\n"
        "print('inet', int(v4.family), int(v6.family))\n"
    )
    status, text = run(env, src)
    assert status == "ok", text
    for line in (
        "pair b'x'",
        "queue 41",
        "pool [1, 2]",
        "listener hi",
        "inet 2 10",
    ):
        assert line in text


@pytest.fixture
def host_sockets() -> Iterator[list[str]]:
    """Listening unix sockets at host paths outside any workspace."""
    made: list[tuple[str, socket.socket]] = []
    folders = []
    for parent in ("/run", "/var/tmp", "/mnt", "/srv", "/opt"):
        if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
            continue
        folder = tempfile.mkdtemp(prefix="deepanalyze-hostsock-", dir=parent)
        os.chmod(folder, 0o755)
        folders.append(folder)
        path = os.path.join(folder, "service.sock")
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        os.chmod(path, 0o777)  # reachable to any uid: only the cells' view can hide it
        server.listen(4)
        made.append((path, server))
    try:
        yield [p for p, _ in made]
    finally:
        for _, server in made:
            server.close()
        for folder in folders:
            remove_tree(folder)


def test_host_path_sockets_are_out_of_reach(env, host_sockets: list[str]):
    if env.kernel.sandbox.get("fs") != "readonly":
        pytest.skip("needs the read-only filesystem (root, or unprivileged user namespaces)")
    assert host_sockets, "no host folder to put a socket in"
    src = "import socket\n"
    for path in host_sockets:
        src += (
            f"s = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({path!r})\n    print('HIT', {path!r})\n"
            f"except OSError as e:\n    print('refused', {path!r}, e.errno)\n"
        )
    src += "import os\nprint('run', os.listdir('/run'), 'var', os.listdir('/var'))\n"
    status, text = run(env, src)
    assert status == "ok" and "HIT" not in text, text
    for path in host_sockets:
        assert f"refused {path} 2" in text  # ENOENT: not in the cells' view at all
    assert "run [] var []" in text
    for path in host_sockets:  # the sockets do work from the host: the refusal is the sandbox's
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(path)
        probe.close()
