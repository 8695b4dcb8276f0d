"""Sandbox escapes (issue 17): each attack a cell tried, as a regression test through real envs.

Every attack runs in episode A while episode B (same task, same fork server) is live: A's
observation says what was refused, A's next cell works and A is still scored (never
``environment_error``), B's output, ``code_pass`` and reward are what B gets alone, and the
task's source data is byte-identical afterwards. Attacks that need a PID namespace or a pids
cgroup skip (saying so) where those cannot be made: both need root, or — the namespace — a
kernel that allows unprivileged user namespaces.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import skyrl_gym

import tools.sandbox
import tools.tree
from deepanalyze_env.core.config import ConfigError
from tests.conftest import code, pid_namespace, qa_extras
from tests.reliability.test_hostile_cells import Case

TIMEOUT_S = 2.0
PROMPT = [{"role": "user", "content": "Which store has the highest revenue?"}]
ANSWER_B = "<Analyze>done</Analyze>\n<Answer>\nAnswer: B\n</Answer>"
NORMAL = "import pandas as pd\nprint(pd.read_csv('sales.csv').groupby('store').revenue.sum())"
# What NORMAL prints for sales.csv (A: 10 + 5, B: 32), written out by hand.
NORMAL_OUTPUT = "\n<Execute>\nstore\nA    15\nB    32\nName: revenue, dtype: int64\n\n</Execute>\n"
MAX_PROCESSES = 64
FILE_CAP_MB = 50

# Self-contained attacks (they find their targets themselves): also run by benchmarks/soak.py.
# Each prints HIT when it got through; the statuses are the policy's own.
_FIND_CTRL = (
    "import os, socket, stat\n"
    "def ctrl():\n"
    "    for fd in range(3, 256):\n"
    "        try:\n"
    "            if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
    "                return socket.socket(fileno=os.dup(fd))\n"
    "        except OSError:\n"
    "            pass\n"
)
ESCAPE_CASES = [
    Case(
        "setns_into_other_netns",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for p in [e for e in os.listdir('/proc') if e.isdigit()]:\n"
        "    try:\n        fd = os.open(f'/proc/{p}/ns/net', os.O_RDONLY)\n"
        "    except OSError:\n        continue\n"
        "    if libc.setns(fd, 0x40000000) == 0:\n        print('HIT setns', p)\n"
        "print('setns refused:', os.strerror(ctypes.get_errno()))",
        ("ok",),
        "setns refused: Operation not permitted",
    ),
    Case(
        "remount_root_rw",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.mount(None, b'/', None, 32 | 4096, None)\n"
        "print('HIT remount' if r == 0 else 'remount refused: ' + os.strerror(ctypes.get_errno()))",
        ("ok",),
        "remount refused: Operation not permitted",
    ),
    Case(
        "write_through_proc_root",
        "import os\nfor p in [e for e in os.listdir('/proc') if e.isdigit()]:\n"
        "    root = f'/proc/{p}/root'\n"
        "    for d in ('etc', 'usr'):\n"
        "        try:\n            open(f'{root}/{d}/da-escape-probe', 'w').write('x')\n"
        "            print('HIT', root, d)\n        except OSError:\n            pass\n"
        "print('proc roots done')",
        ("ok",),
        "proc roots done",
    ),
    Case(
        "leave_pids_cgroup",
        "import os\nfor path in ('/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/cgroup.procs'):\n"
        "    try:\n        open(path, 'w').write(str(os.getpid()))\n        print('HIT', path)\n"
        "    except OSError as exc:\n        print('cgroup refused:', exc.strerror)",
        ("ok",),
        "cgroup refused:",
    ),
    Case(
        "kill_everything_visible",
        # Only inside a PID namespace (the worker is its pid 1): elsewhere a real massacre.
        "import os, signal\nn = 0\nif os.getppid() == 1:\n"
        "    try:\n        os.kill(-1, signal.SIGKILL)\n    except OSError:\n        pass\n"
        "for p in [int(e) for e in os.listdir('/proc') if e.isdigit()] if os.getppid() == 1 else []:\n"
        "    if p not in (1, os.getpid()):\n"
        "        try:\n            os.kill(p, signal.SIGKILL)\n            n += 1\n        except OSError:\n"
        "            pass\nprint('signalled', n)",
        ("ok",),
        "signalled",
    ),
    Case(
        "alarm_between_cells",
        "import signal, os\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.5)\nsignal.alarm(1)\nprint('armed')",
        ("ok",),
        "armed",
    ),
    Case(
        "forged_huge_reply",
        _FIND_CTRL + "s = ctrl()\ntry:\n"
        "    s.sendall((200 * 2**20).to_bytes(4, 'big') + b'x' * 2**20)\nexcept OSError:\n    pass\n"
        "print('sent')",
        ("crashed",),
        "tampered",
    ),
    Case(
        "forged_reply_wrong_seq",
        _FIND_CTRL + "import json\nbody = json.dumps({'seq': -7, 'status': 'ok'}).encode()\n"
        "ctrl().sendall(len(body).to_bytes(4, 'big') + body)\nimport time\ntime.sleep(0.5)",
        ("crashed",),
        "tampered",
    ),
    Case(
        "fallocate_past_cap",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = os.open('fa.bin', os.O_CREAT | os.O_RDWR)\n"
        "r = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(200 * 2**20))\n"
        "print('fallocate', r, os.strerror(ctypes.get_errno()))\n"
        "try:\n    os.posix_fallocate(fd, 0, 200 * 2**20)\nexcept OSError as exc:\n"
        "    print('posix_fallocate', exc.strerror)\nprint('allocated', os.fstat(fd).st_blocks * 512)",
        ("ok",),
        "fallocate -1 Operation not supported",
    ),
    Case(
        "privileged_syscalls",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for name, call in [('unshare', lambda: libc.unshare(0x10000000)), "
        "('ptrace', lambda: libc.ptrace(0, 0, 0, 0)), ('chroot', lambda: libc.chroot(b'/tmp'))]:\n"
        "    print(name, 'HIT' if call() == 0 else os.strerror(ctypes.get_errno()))",
        ("ok",),
        "unshare Operation not permitted",
    ),
]


@pytest.fixture(autouse=True)
def _small_caps(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "file_size_mb", FILE_CAP_MB)
    monkeypatch.setitem(tools.sandbox.DEFAULTS, "max_processes", MAX_PROCESSES)


def make_env(root: Path, stateful: bool = False, **executor):
    executor = {"timeout_s": TIMEOUT_S, "memory_mb": 512, **executor}
    env = skyrl_gym.make(
        "deepanalyze",
        env_config={"workspace_root": str(root), "executor": executor, "stateful_cells": stateful},
        extras=qa_extras(),
    )
    env.init(PROMPT)
    return env


def need(env, key: str, why: str) -> None:
    if not env.kernel.sandbox.get(key):
        env.close()
        pytest.skip(why)


NEED_PID_NS = "needs a PID namespace per worker: root, or unprivileged user namespaces"
NEED_CGROUP = "needs root with a writable pids cgroup"


class Episodes:
    """Attacker A and bystander B, live at the same time on the same task."""

    def __init__(self, root: Path, stateful: bool = False):
        self.source = root / "data" / "ws" / "sales.csv"
        self.original = self.source.read_bytes()
        self.b = make_env(root)
        first = self.b.step(code(NORMAL))
        assert first["observations"][0]["content"] == NORMAL_OUTPUT
        self.a = make_env(root, stateful=stateful)
        self.b_copy = self.b.workspace.path / "sales.csv"

    def values(self) -> dict[str, str]:
        return {
            "@TRAINER@": str(os.getpid()),
            "@SERVER@": str(self.a.kernel.server.proc.pid),
            "@BWORKER@": str(self.b.kernel.pid),
            "@BWS@": str(self.b.workspace.path),
            "@SOURCE@": str(self.source),
        }

    def attack(self, src: str) -> tuple[dict, float]:
        for key, value in self.values().items():
            src = src.replace(key, value)
        start = time.monotonic()
        out = self.a.step(code(src))
        return out, time.monotonic() - start

    def finish(self, next_status: str = "ok") -> None:
        """A's next cell, both answers, both closed; B and the source data as if alone."""
        try:
            nxt = self.a.step(code("print('next')"))
            assert nxt["metadata"]["exec"]["status"] == next_status, nxt["observations"][0]["content"]
            if next_status != "ok":
                nxt = self.a.step(code("print('next')"))
            assert nxt["observations"][0]["content"] == "\n<Execute>\nnext\n\n</Execute>\n"
            a_final = self.a.step(ANSWER_B)
            assert a_final["metadata"]["reward_status"] == "scored", a_final["metadata"]
            b_out = self.b.step(code(NORMAL))
            assert b_out["observations"][0]["content"] == NORMAL_OUTPUT
            assert b_out["metadata"]["code_pass"] == 1
            b_final = self.b.step(ANSWER_B)
            assert b_final["metadata"]["reward_status"] == "scored" and b_final["reward"] == 1.0
            assert b_final["metadata"]["code_pass"] == [1, 1]
        finally:
            self.close()
        assert self.source.read_bytes() == self.original

    def close(self) -> None:
        self.a.close()
        self.b.close()


def observation(out: dict) -> str:
    return out["observations"][0]["content"]


# Forged reply frames need the control socket, which only a stateful cell's process holds
# (test_a_stateless_cell_holds_no_socket): they are played against a stateful worker.
STATEFUL_ONLY = {"forged_huge_reply", "forged_reply_wrong_seq"}


@pytest.mark.parametrize("case", ESCAPE_CASES, ids=[c.name for c in ESCAPE_CASES])
def test_escape_attempt_is_refused(case: Case, workspace_root: Path):
    eps = Episodes(workspace_root, stateful=case.name in STATEFUL_ONLY)
    if case.name in ("leave_pids_cgroup",):
        need(eps.a, "cgroup", NEED_CGROUP)
    if case.name in ("setns_into_other_netns", "remount_root_rw", "kill_everything_visible"):
        need(eps.a, "pid_ns", NEED_PID_NS)
    rss_before = psutil.Process().memory_info().rss
    out, took = eps.attack(case.src)
    text = observation(out)
    assert took < TIMEOUT_S + 2.0
    assert out["metadata"]["exec"]["status"] in case.statuses, text[-600:]
    assert "HIT" not in text, text[-600:]
    assert case.says in text, text[-600:]
    if case.name == "forged_huge_reply":
        assert psutil.Process().memory_info().rss - rss_before < 50 * 2**20
    if case.name == "fallocate_past_cap":
        allocated = int(text.split("allocated ")[1].split()[0])
        assert allocated <= FILE_CAP_MB * 2**20
    if case.name == "alarm_between_cells":
        time.sleep(1.2)  # the timers would have fired by now
    eps.finish()


def test_setns_into_the_servers_network_reaches_nothing(workspace_root: Path):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    eps = Episodes(workspace_root)
    try:
        need(eps.a, "pid_ns", NEED_PID_NS)
        out, _ = eps.attack(
            "import ctypes, os, socket\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for p in ['@SERVER@', '@TRAINER@', str(os.getppid())]:\n"
            "    try:\n        fd = os.open(f'/proc/{p}/ns/net', os.O_RDONLY)\n"
            "    except OSError as exc:\n        print('open', p, exc.strerror)\n        continue\n"
            "    print('setns', p, 'HIT' if libc.setns(fd, 0) == 0 else os.strerror(ctypes.get_errno()))\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
            "    print('HIT connected')\nexcept OSError as exc:\n    print('connect', exc.strerror)"
        )
        text = observation(out)
        assert "HIT" not in text and "\nconnect " in text, text  # unreachable: an empty namespace
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    eps.finish()


def test_source_data_and_other_workspaces_cannot_be_rewritten(workspace_root: Path):
    eps = Episodes(workspace_root)
    b_copy = eps.b_copy.read_bytes()
    out, _ = eps.attack(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('remount', libc.mount(None, b'/', None, 32 | 4096, None))\n"
        "targets = ['@SOURCE@', '@BWS@/sales.csv']\n"
        "for p in [e for e in os.listdir('/proc') if e.isdigit()] + ['@SERVER@', '@TRAINER@', '@BWORKER@']:\n"
        "    targets += [f'/proc/{p}/root@SOURCE@', f'/proc/{p}/root@BWS@/sales.csv']\n"
        "for t in targets:\n    try:\n        open(t, 'a').write('Z,999\\n')\n        print('HIT', t)\n"
        "    except OSError as exc:\n        pass\nprint('done', len(targets))"
    )
    text = observation(out)
    assert "HIT" not in text and "done" in text and "remount -1" in text, text
    assert eps.b_copy.read_bytes() == b_copy
    eps.finish()


def test_pids_cgroup_holds_against_leaving_it(workspace_root: Path):
    eps = Episodes(workspace_root)
    need(eps.a, "cgroup", NEED_CGROUP)
    out, _ = eps.attack(
        "import os, time\nfor path in ('/sys/fs/cgroup/pids/cgroup.procs', '/sys/fs/cgroup/pids/tasks'):\n"
        "    try:\n        open(path, 'w').write(str(os.getpid()))\n        print('HIT', path)\n"
        "    except OSError as exc:\n        print('refused', exc.strerror)\n"
        "import subprocess\nkids = []\ntry:\n    for _ in range(200):\n"
        "        kids.append(subprocess.Popen(['sleep', '30']))\nexcept OSError:\n    pass\n"
        "print('forked', len(kids))\nfor k in kids:\n    k.kill()\n    k.wait()"
    )
    text = observation(out)
    assert "HIT" not in text, text
    assert int(text.split("forked ")[1].split()[0]) < MAX_PROCESSES
    eps.finish()


def test_trainer_memory_is_out_of_reach(workspace_root: Path):
    secret = b"ground-truth-not-for-cells"
    buf = bytearray(secret)
    import ctypes

    addr = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    eps = Episodes(workspace_root)
    out, _ = eps.attack(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for p in ['@TRAINER@', '@SERVER@']:\n    for f in ('mem', 'environ'):\n"
        "        try:\n            open(f'/proc/{p}/{f}', 'rb').read(16)\n            print('HIT', p, f)\n"
        "        except OSError as exc:\n            print('refused', p, f, exc.strerror)\n"
        "class Iov(ctypes.Structure):\n    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "buf = ctypes.create_string_buffer(64)\n"
        "local = Iov(ctypes.cast(buf, ctypes.c_void_p), 26)\n"
        f"remote = Iov({addr}, 26)\n"
        "r = libc.process_vm_readv(@TRAINER@, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "print('readv', 'HIT' if r > 0 else os.strerror(ctypes.get_errno()))\n"
        "r = libc.ptrace(16, @TRAINER@, 0, 0)\n"
        "print('ptrace', 'HIT' if r == 0 else os.strerror(ctypes.get_errno()))"
    )
    text = observation(out)
    assert "HIT" not in text and "readv Operation not permitted" in text, text
    assert bytes(buf) == secret
    eps.finish()


def test_sibling_worker_fork_server_and_trainer_cannot_be_killed(workspace_root: Path):
    eps = Episodes(workspace_root)
    need(eps.a, "pid_ns", NEED_PID_NS)
    server = eps.a.kernel.server.proc
    out, _ = eps.attack(
        "import os\nfor p in [@BWORKER@, @SERVER@, @TRAINER@]:\n"
        "    try:\n        os.kill(p, 9)\n        print('HIT', p)\n"
        "    except OSError as exc:\n        print('refused', exc.strerror)\n"
        "try:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\n"
        "print('visible', sorted(int(e) for e in os.listdir('/proc') if e.isdigit()), os.getpid())"
    )
    text = observation(out)
    own = text.split("visible ", 1)[1].split("\n", 1)[0].rsplit(" ", 1)[1]
    assert "HIT" not in text and f"visible [1, {own}] {own}" in text, text  # the worker and itself
    assert server.poll() is None
    eps.finish()


def test_no_socket_a_cell_could_ask_the_fork_server_for_a_worker(workspace_root: Path):
    """The server listens nowhere (an inherited socket pair), and its command line names none."""
    eps = Episodes(workspace_root)
    server = psutil.Process(eps.a.kernel.server.proc.pid)
    try:
        assert all(not c.laddr for c in server.net_connections(kind="unix"))
        assert not any(".sock" in arg for arg in server.cmdline())
        out, _ = eps.attack(
            "import socket, os\nfound = 0\n"
            "for line in open('/proc/net/unix').read().splitlines()[1:]:\n    parts = line.split()\n"
            "    if len(parts) >= 8 and parts[7].startswith('/'):\n        found += 1\n"
            "        try:\n            s = socket.socket(socket.AF_UNIX)\n            s.connect(parts[7])\n"
            "            print('HIT', parts[7])\n        except OSError:\n            pass\n"
            "print('paths', found)"
        )
        assert "HIT" not in observation(out)
    except BaseException:
        eps.close()
        raise
    eps.finish()


def test_a_request_cannot_loosen_the_servers_sandbox(workspace_root: Path):
    """Even the env's own channel: the sandbox in force is the server's, fixed at its start."""
    from tools import kernel_server as wire
    from tools.fork_server import KernelServer

    eps = Episodes(workspace_root)
    server: KernelServer = eps.a.kernel.server
    out_r, out_w = os.pipe()
    ctrl, theirs = socket.socketpair()
    loose = {"network": True, "readonly_fs": False, "cgroup": False, "pid_namespace": False, "seccomp": False}
    spec = {"op": "spawn", "workspace": str(eps.a.workspace.path), "sandbox": loose}
    with server._chan_lock:
        socket.send_fds(server._chan, [json.dumps(spec).encode()], [theirs.fileno(), out_w])
    theirs.close()
    os.close(out_w)
    ctrl.settimeout(30)
    hello, fds = wire.recv_msg(ctrl, with_fds=True)
    try:
        assert hello["sandbox"]["network"] == eps.a.kernel.sandbox["network"]
        assert hello["sandbox"]["fs"] == eps.a.kernel.sandbox["fs"]
        assert hello["sandbox"]["pid_ns"] == eps.a.kernel.sandbox["pid_ns"]
        assert hello["sandbox"]["seccomp"] == eps.a.kernel.sandbox["seccomp"]
    finally:
        signal.pidfd_send_signal(fds[0], signal.SIGKILL)
        os.close(fds[0])
        ctrl.close()
        os.close(out_r)
    eps.finish()


def test_a_stateless_cell_holds_no_socket(workspace_root: Path):
    """A default-mode cell's process has stdin, its own output pipe (stdout, stderr) and its
    status pipe open, nothing else: no control socket to forge a reply on, no episode pipe."""
    eps = Episodes(workspace_root)
    out, _ = eps.attack(
        "import os, stat\nfor fd in sorted(int(e) for e in os.listdir('/proc/self/fd')):\n"
        "    try:\n        m = os.fstat(fd).st_mode\n    except OSError:\n        continue\n"
        "    print(fd, 'sock' if stat.S_ISSOCK(m) else 'fifo' if stat.S_ISFIFO(m) else 'other')"
    )
    lines = observation(out).split("\n")[2:-3]
    assert "sock" not in observation(out), observation(out)
    assert lines[:3] == ["0 other", "1 fifo", "2 fifo"] and len(lines) <= 5, lines  # + status, listing
    eps.finish()


def test_partial_forged_frame_ends_the_cell_on_time(workspace_root: Path):
    eps = Episodes(workspace_root, stateful=True)
    out, took = eps.attack(_FIND_CTRL + "ctrl().sendall((4096).to_bytes(4, 'big'))\nprint('header sent')")
    assert took < TIMEOUT_S + 1.0
    assert out["metadata"]["exec"]["status"] == "timeout", observation(out)
    assert "did not finish within" in observation(out)
    eps.finish()


def test_forged_reply_cannot_shift_later_replies(workspace_root: Path):
    """A cell that forges its own reply (it can read the request's sequence number) gains at
    most what a try/except would; the real reply is caught as a violation, with the forged one
    or at the next cell, and never taken as a later request's reply (stateful cells: only
    they share the worker's socket)."""
    eps = Episodes(workspace_root, stateful=True)
    out, _ = eps.attack(
        _FIND_CTRL + "import sys, json\nf = sys._getframe(1)\nwhile 'msg' not in f.f_locals:\n"
        "    f = f.f_back\nseq = f.f_locals['msg']['seq']\n"
        "body = json.dumps({'seq': seq, 'status': 'ok'}).encode()\n"
        "ctrl().sendall(len(body).to_bytes(4, 'big') + body)\nraise ValueError('real failure')"
    )
    status = out["metadata"]["exec"]["status"]
    if status == "crashed":  # the real reply arrived with the forged one: caught right away
        assert "tampered" in observation(out)
        eps.finish()
    else:  # the forged reply was read alone; the real one is caught at the next cell
        assert status == "ok"
        eps.finish(next_status="crashed")


def test_timer_that_kills_a_stateful_worker_is_the_policys_crash(workspace_root: Path):
    eps = Episodes(workspace_root, stateful=True)
    out, _ = eps.attack(
        "import threading, os\nthreading.Timer(0.3, os._exit, args=(0,)).start()\nprint('set')"
    )
    assert out["metadata"]["exec"]["status"] == "ok"
    time.sleep(1.0)
    after = eps.a.step(code("print('after')"))
    assert after["done"] is False, after["metadata"]
    assert after["metadata"]["exec"]["status"] == "crashed"
    assert "died after the previous cell" in observation(after)
    eps.finish()


def test_double_forked_daemon_is_gone_after_close(workspace_root: Path):
    eps = Episodes(workspace_root, stateful=True)  # stateful: the worker is not recycled early
    need(eps.a, "pid_ns", NEED_PID_NS)
    ns = pid_namespace(eps.a.kernel.pid)
    out, _ = eps.attack(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(300)\n    os._exit(0)\ntime.sleep(0.2)\n"
        "try:\n    os.kill(@SERVER@, 9)\n    print('HIT')\nexcept OSError:\n    print('daemon left')"
    )
    assert "daemon left" in observation(out) and "HIT" not in observation(out)
    eps.finish()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        pid_namespace(e) == ns for e in os.listdir("/proc") if e.isdigit()
    ):
        time.sleep(0.05)
    assert not any(pid_namespace(e) == ns for e in os.listdir("/proc") if e.isdigit())


def test_cells_see_only_their_episode_and_no_privilege(workspace_root: Path):
    eps = Episodes(workspace_root)
    need(eps.a, "pid_ns", NEED_PID_NS)
    out, _ = eps.attack(
        "import os\nprocs = sorted(int(e) for e in os.listdir('/proc') if e.isdigit())\n"
        "print('procs', procs == [1, os.getpid()])\n"
        "print('dev', sorted(os.listdir('/dev')))\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
        "print('caps', {k: status[k].strip() for k in ('CapEff', 'CapPrm', 'CapBnd', 'CapAmb')})\n"
        "print('nnp', status['NoNewPrivs'].strip(), 'seccomp', status['Seccomp'].strip(),"
        " 'uid', os.getuid())\n"
        "for path in ('/proc/sys/kernel/domainname', '/sys/kernel/mm/transparent_hugepage/enabled'):\n"
        "    try:\n        open(path, 'w').write('x')\n        print('HIT', path)\n"
        "    except OSError as exc:\n        print('ro', exc.strerror)"
    )
    text = observation(out)
    assert "procs True" in text, text  # its worker (the namespace's init) and itself
    zero = "0000000000000000"
    assert f"'CapEff': '{zero}', 'CapPrm': '{zero}', 'CapBnd': '{zero}', 'CapAmb': '{zero}'" in text
    assert "nnp 1 seccomp 2" in text
    devices = text.split("dev ", 1)[1].split("\n", 1)[0]
    assert not any(f"'{d}'" in devices for d in ("vda", "sda", "mem", "kmsg", "kvm", "loop0")), devices
    if os.geteuid() == 0 and eps.a.kernel.sandbox["uid"] != 0:
        assert "uid 65534" in text  # sandbox.uid: root's cells run unprivileged
    assert "HIT" not in text
    eps.finish()


def test_credentials_under_any_name_stay_out(workspace_root: Path, monkeypatch: pytest.MonkeyPatch):
    from tools.fork_server import KernelServer

    for name in ("MYSQL_PWD", "DATABASE_URL", "PGPASSFILE", "AWS_ACCESS_KEY_ID", "MY_SERVICE_DSN"):
        monkeypatch.setenv(name, "not-for-cells")
    KernelServer.shutdown_all()  # the next episode starts a server with today's environment
    eps = Episodes(workspace_root)
    out, _ = eps.attack("import os\nprint(sorted(v for v in os.environ.values() if v == 'not-for-cells'))")
    assert observation(out) == "\n<Execute>\n[]\n\n</Execute>\n"
    eps.finish()


def test_stale_pid_is_never_killed():
    """The pidfd of a reaped worker kills nothing, whatever now holds that pid number."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    pidfd = os.pidfd_open(gone.pid)
    gone.wait()
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        # Pretend the bystander got the dead worker's pid (pids are reused this way).
        tools.sandbox.kill_tree_by_pidfd(pidfd, bystander.pid, timeout_s=0.2)
        time.sleep(0.1)
        assert bystander.poll() is None
    finally:
        os.close(pidfd)
        bystander.kill()
        bystander.wait()


def _task_root(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "root" / "data" / "ws"
    folder.mkdir(parents=True)
    (folder / "sales.csv").write_text("store,revenue\nA,10\nB,32\nA,5\n")
    return tmp_path / "root", folder


@pytest.mark.parametrize("kind", ["outside_file", "outside_dir", "loop", "ancestor"])
def test_task_folder_links_out_are_refused_by_name(tmp_path: Path, kind: str):
    root, folder = _task_root(tmp_path)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host")
    link = folder / "link"
    targets = {"outside_file": secret, "outside_dir": tmp_path, "loop": link, "ancestor": folder}
    target = targets[kind]
    link.symlink_to(target)
    env = skyrl_gym.make("deepanalyze", env_config={"workspace_root": str(root)}, extras=qa_extras())
    with pytest.raises(ConfigError, match=str(link)):
        env.init(PROMPT)
    env.close()


def test_task_folder_links_inside_are_copied(tmp_path: Path):
    root, folder = _task_root(tmp_path)
    (folder / "alias.csv").symlink_to(folder / "sales.csv")
    env = skyrl_gym.make("deepanalyze", env_config={"workspace_root": str(root)}, extras=qa_extras())
    env.init(PROMPT)
    try:
        out = env.step(code("print(open('alias.csv').read() == open('sales.csv').read())"))
        assert observation(out) == "\n<Execute>\nTrue\n\n</Execute>\n"
    finally:
        env.close()


def test_cleanup_never_changes_a_file_a_link_points_to(tmp_path: Path):
    host = tmp_path / "host.txt"
    host.write_text("x")
    host.chmod(0o400)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    link = scratch / "link"
    link.symlink_to(host)
    (scratch / "sub").mkdir()
    (scratch / "sub" / "up").symlink_to(tmp_path)  # a link to a folder: removed, never entered
    scratch.chmod(0o500)
    assert tools.tree.remove_tree(scratch)
    assert not scratch.exists() and host.read_text() == "x"
    assert host.stat().st_mode & 0o777 == 0o400


DRIVER = r"""
import json, os, sys, tempfile, time
from tools.fork_server import KernelServer
from tools.kernel import Kernel
root = tempfile.mkdtemp()
a_ws, b_ws = os.path.join(root, 'a'), os.path.join(root, 'b')
os.mkdir(a_ws); os.mkdir(b_ws)
open(os.path.join(b_ws, 'data.txt'), 'w').write('bystander')
kw = dict(timeout_s=3, python=sys.executable, preload=())
b = Kernel(b_ws, **kw)
a = Kernel(a_ws, **kw)
res = {'sandbox': a.sandbox, 'b_before': b.run("print(open('data.txt').read())").output}
KILL = "import os\nfor p in (%d, %d, %d):\n    try:\n        os.kill(p, 9)\n        print('HIT', p)\n"
KILL += "    except OSError as e:\n        print('refused')"
REFUSED = "\nexcept OSError as e:\n    print('refused', e.strerror)"
MEM = "try:\n    open('/proc/%d/mem', 'rb')\n    print('HIT')" + REFUSED
SETNS = "import ctypes, os\nl = ctypes.CDLL(None, use_errno=True)\n"
SETNS += "fd = os.open('/proc/self/ns/net', os.O_RDONLY)\nprint('HIT' if l.setns(fd, 0) == 0 else 'refused')"
WRITE = "try:\n    open(%r, 'a').write('x')\n    print('HIT')" + REFUSED
attacks = {
  'kill': KILL % (b.pid, a.server.proc.pid, os.getpid()),
  'mem': MEM % os.getpid(),
  'setns': SETNS,
  'alarm': "import signal\nsignal.alarm(1)\nprint('armed')",
  'write_b': WRITE % os.path.join(b_ws, 'data.txt'),
}
for name, src in attacks.items():
    r = a.run(src)
    res[name] = [r.status, r.output]
time.sleep(1.2)
r = a.run("print('next')")
res['next'] = [r.status, r.output]
res['b_after'] = b.run("print(open('data.txt').read())").output
a.close(); b.close(); KernelServer.shutdown_all()
print(json.dumps(res))
"""


def test_attacks_fail_for_a_normal_user_too(tmp_path: Path):
    """The same env code run by an unprivileged uid (a user namespace gives it the PID, mount
    and network namespaces where the kernel allows unprivileged ones)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root (to start the check as an unprivileged uid) and setpriv")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK):
        pytest.skip("no system interpreter the unprivileged uid can run")
    tools_copy = Path(tempfile.mkdtemp(prefix="da-nonroot-"))
    try:
        shutil.copytree(Path(tools.sandbox.__file__).parent, tools_copy / "tools")
        for path in [tools_copy, *tools_copy.rglob("*")]:
            path.chmod(0o755)
        proc = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", python, "-c", DRIVER],
            cwd=tools_copy,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(tools_copy)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(tools_copy, ignore_errors=True)
    if proc.returncode != 0:
        if "No module named" in proc.stderr or "Permission denied" in proc.stderr:
            pytest.skip(f"the unprivileged uid cannot run the env here: {proc.stderr.strip()[-200:]}")
        raise AssertionError(proc.stderr[-2000:])
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["b_before"] == res["b_after"] == "bystander\n"
    assert res["alarm"][0] == "ok" and res["next"] == ["ok", "next\n"]
    if not res["sandbox"].get("pid_ns"):
        pytest.skip("unprivileged user namespaces are not allowed here: only the timer check holds")
    for name in ("kill", "mem", "setns", "write_b"):
        status, output = res[name]
        assert status == "ok" and "HIT" not in output and "refused" in output, (name, output)
    assert res["sandbox"]["caps"] == "none" and res["sandbox"]["seccomp"] == "on"
