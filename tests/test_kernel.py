"""The executor: real worker processes forked from the real kernel server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import pid_namespace, wait_gone, wait_gone_inside
from tools.kernel import Kernel


@pytest.fixture
def kernel(tmp_path: Path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n3,4\n")
    k = Kernel(tmp_path, timeout_s=2.0, max_output_chars=2000)
    yield k
    k.close()


def test_cell_output_is_captured(kernel: Kernel):
    result = kernel.run("print('hello')")
    assert (result.status, result.output) == ("ok", "hello\n")


def test_empty_output_is_a_pass(kernel: Kernel):
    result = kernel.run("x = 1")
    assert result.passed and result.output == ""


def test_stdout_and_stderr_are_interleaved_in_order(kernel: Kernel):
    result = kernel.run("import sys\nprint('one')\nsys.stderr.write('two\\n')\nprint('three')")
    assert result.output == "one\ntwo\nthree\n"


def test_output_of_subprocesses_is_captured(kernel: Kernel):
    result = kernel.run("import os\nos.system('echo from-shell')")
    assert "from-shell" in result.output


def test_exception_renders_traceback_at_the_users_line(kernel: Kernel):
    result = kernel.run("x = 1\ny = [1, 2]\nprint(y[5])")
    assert result.status == "error"
    assert result.output.startswith("[Error]:\nTraceback (most recent call last):\n")
    assert '  File "<string>", line 3, in <module>\n    print(y[5])\n' in result.output
    assert result.output.rstrip().endswith("IndexError: list index out of range")


def test_output_before_an_exception_is_kept(kernel: Kernel):
    result = kernel.run("print('partial')\nraise ValueError('bad value')")
    assert result.output.startswith("partial\n[Error]:\n")
    assert "ValueError: bad value" in result.output


def test_exception_inside_library_points_at_the_calling_line(kernel: Kernel):
    result = kernel.run("import pandas as pd\ndf = pd.read_csv('data.csv')\ndf['missing_col']")
    assert result.status == "error"
    assert "line 3" in result.output and "df['missing_col']" in result.output
    assert "KeyError" in result.output
    assert "site-packages" not in result.output


def test_syntax_error_is_an_error_with_location(kernel: Kernel):
    result = kernel.run("print(")
    assert result.status == "error"
    assert result.output.startswith("[Error]:\n") and "SyntaxError" in result.output


def test_system_exit_is_an_error_not_a_crash(kernel: Kernel):
    result = kernel.run("import sys\nsys.exit(0)")
    assert result.status == "error" and "SystemExit" in result.output
    assert kernel.run("print('alive')").output == "alive\n"


def test_timeout_is_enforced_by_wall_clock(kernel: Kernel):
    start = time.monotonic()
    result = kernel.run("import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert result.status == "timeout"
    assert time.monotonic() - start < 2.0 + 1.5
    assert result.output.startswith("started\n")
    assert "did not finish within 2 seconds" in result.output


def test_next_cell_works_after_a_timeout(kernel: Kernel):
    kernel.run("while True:\n    pass")
    assert kernel.run("print(6 * 7)").output == "42\n"


def test_timeout_kills_the_cells_child_processes(kernel: Kernel):
    ns = pid_namespace(kernel.pid)
    result = kernel.run(
        "import subprocess, time\np = subprocess.Popen(['sleep', '300'])\n"
        "print(p.pid, flush=True)\ntime.sleep(60)"
    )
    assert result.status == "timeout"
    child = int(result.output.split()[0])
    assert wait_gone_inside(child, ns)


def test_process_death_is_reported_as_crashed(kernel: Kernel):
    result = kernel.run("import os\nos._exit(3)")
    assert result.status == "crashed"
    assert "[Error]:" in result.output
    assert kernel.run("print('recovered')").output == "recovered\n"


def test_segfault_is_reported_as_crashed(kernel: Kernel):
    result = kernel.run("import ctypes\nctypes.string_at(0)")
    assert result.status == "crashed"


def test_long_output_is_cut_keeping_head_and_tail_without_deadlock(kernel: Kernel):
    result = kernel.run("import sys\nsys.stdout.write('H' * 1000 + 'x' * 5_000_000 + 'T' * 1000)")
    assert result.status == "ok" and result.truncated
    assert len(result.output) < 2200
    assert result.output.startswith("H" * 1000) and result.output.endswith("T" * 1000)
    assert "output truncated" in result.output


def test_cells_get_a_fresh_namespace_by_default(kernel: Kernel):
    kernel.run("secret = 5")
    result = kernel.run("print(secret)")
    assert result.status == "error" and "NameError" in result.output


def test_stateful_cells_keep_variables(tmp_path: Path):
    k = Kernel(tmp_path, timeout_s=2.0, stateful=True)
    try:
        k.run("secret = 5")
        assert k.run("print(secret)").output == "5\n"
    finally:
        k.close()


def test_stateful_kernel_says_variables_were_lost_after_timeout(tmp_path: Path):
    k = Kernel(tmp_path, timeout_s=1.0, stateful=True)
    try:
        k.run("secret = 5")
        assert "variables from earlier cells are lost" in k.run("while True: pass").output
        assert "NameError" in k.run("print(secret)").output
    finally:
        k.close()


def test_working_directory_is_reset_before_each_cell(kernel: Kernel):
    kernel.run("import os\nos.chdir('/')")
    result = kernel.run("import os\nprint(os.listdir('.'))")
    assert "data.csv" in result.output


def test_matplotlib_uses_agg_and_saves_into_the_workspace(kernel: Kernel, tmp_path: Path):
    result = kernel.run(
        "import matplotlib\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.savefig('fig.png')\n"
        "print(matplotlib.get_backend())"
    )
    assert result.output.strip().lower() == "agg"
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_open_figures_are_closed_between_cells(kernel: Kernel):
    kernel.run("import matplotlib.pyplot as plt\nplt.figure()\nplt.figure()")
    assert kernel.run("import matplotlib.pyplot as plt\nprint(len(plt.get_fignums()))").output == "0\n"


def test_memory_limit_stops_a_memory_bomb(tmp_path: Path):
    k = Kernel(tmp_path, timeout_s=5.0, memory_mb=256)
    try:
        result = k.run("x = bytearray(1024 * 1024 * 1024)\nprint('allocated')")
        assert result.status in ("error", "crashed")
        assert "allocated" not in result.output
        assert k.run("print('ok')").output == "ok\n"
    finally:
        k.close()


def test_preloaded_stack_is_importable_and_versions_are_reported(kernel: Kernel):
    result = kernel.run(
        "import pandas, seaborn, sklearn, statsmodels, networkx, scipy, openpyxl\nprint('ok')"
    )
    assert result.output == "ok\n"
    assert kernel.versions["pandas"] == __import__("pandas").__version__
    assert "python" in kernel.versions


def test_close_kills_the_worker(tmp_path: Path):
    k = Kernel(tmp_path)
    pid = k.pid
    assert pid is not None and os.path.exists(f"/proc/{pid}")
    k.close()
    assert wait_gone(pid)


def test_worker_killed_between_cells_is_reported_as_lost(tmp_path: Path):
    from tools.kernel import KernelLost

    k = Kernel(tmp_path)
    try:
        os.kill(k.pid, 9)
        assert wait_gone(k.pid)
        time.sleep(0.1)
        with pytest.raises(KernelLost):
            k.run("print(1)")
    finally:
        k.close()


def test_kernel_can_run_under_another_interpreter(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """executor.python: cells run in a separate venv (here a bare one, without the stack)."""
    import subprocess
    import sys

    venv = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    work = tmp_path / "ws"
    work.mkdir()
    k = Kernel(work, python=str(venv / "bin" / "python"), preload=("json", "pandas"))
    try:
        assert k.run("import sys\nprint(sys.prefix)").output.strip() == str(venv)
        assert "ModuleNotFoundError" in k.run("import pandas").output
        assert "pandas" not in k.versions and k.versions["python"]
        assert "pandas" in k.server.failed_preloads
    finally:
        k.close()


def test_a_kernel_works_with_descriptors_past_1024(tmp_path: Path):
    """A trainer running a thousand episodes holds more than 1,024 descriptors; ``select``
    refuses those (ValueError), so the kernel handle must poll."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1400:
        pytest.skip("the descriptor limit is below 1,400 here")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        k = Kernel(tmp_path, timeout_s=5)
        try:
            assert k._ctrl.fileno() > 1024
            first = k.run("print(6 * 7)")
            assert (first.status, first.output) == ("ok", "42\n")
            late = k.run("import time\ntime.sleep(30)")
            assert late.status == "timeout"
            assert k.run("print(1)").status == "ok"
        finally:
            k.close()
    finally:
        for fd in held:
            os.close(fd)


def test_a_crashed_cell_keeps_its_worker_by_default(kernel: Kernel):
    """The cell's own process died; the worker that judged it did not (no restart needed)."""
    worker = kernel.pid
    assert kernel.run("import os\nos._exit(0)").status == "crashed"  # exit 0 without a report
    assert kernel.pid == worker and kernel.restarts == 0
    assert kernel.run("print('after')").output == "after\n"


def test_each_cell_runs_in_a_process_of_its_own(kernel: Kernel):
    first = kernel.run("import os\nprint(os.getpid(), os.getppid())").output.split()
    second = kernel.run("import os\nprint(os.getpid(), os.getppid())").output.split()
    assert first[0] != second[0]  # a new process for each cell
    assert first[1] == second[1]  # forked by the same worker


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (b"ok\n", ("ok", None)),
        (b"error ZeroDivisionError\n", ("error", "ZeroDivisionError")),
        (b"ok\nerror X\n", ("ok", None)),  # the first line decides
        (b"okay\n", ("crashed", None)),
        (b"ok", ("crashed", None)),  # no end of line: the child died mid-report
        (b"error two words\n", ("crashed", None)),
        (b"error \xe2\x80\x8bX\n", ("crashed", None)),
        (b"error " + b"E" * 200 + b"\n", ("crashed", None)),
        (b"", ("crashed", None)),
        (b'{"status": "ok"}\n', ("crashed", None)),
    ],
)
def test_a_cells_report_of_itself_is_parsed_strictly(record: bytes, expected: tuple):
    from tools.kernel_server import _parse_status

    assert _parse_status(record) == expected


def test_an_empty_cell_is_a_cell(kernel: Kernel):
    result = kernel.run("")
    assert (result.status, result.output) == ("ok", "")


def test_no_pid_namespace_is_refused_unless_allowed(tmp_path: Path):
    """Without a PID namespace a cell reaches other episodes' files through /proc/<pid>/root:
    the kernel does not start with it unless ``allow_unsafe`` says so, and its one-line error
    names what failed and what to set."""
    from tools.kernel import KernelError

    with pytest.raises(KernelError) as err:
        Kernel(tmp_path, timeout_s=2.0, sandbox={"pid_namespace": False})
    message = str(err.value)
    assert "\n" not in message
    assert "no PID namespace" in message and "executor.sandbox.allow_unsafe: true" in message


def test_cells_never_run_as_root_on_a_writable_filesystem_by_default(tmp_path: Path):
    """With ``readonly_fs`` off, cells either run as a uid other than 0 or the kernel refuses
    to start (here, as root, uid 65534 cannot read an interpreter under /root)."""
    from tools.kernel import KernelError

    try:
        k = Kernel(tmp_path, timeout_s=5.0, sandbox={"readonly_fs": False})
    except KernelError as exc:
        assert "root on a writable filesystem" in str(exc) and "allow_unsafe" in str(exc)
        return
    try:
        assert k.run("import os\nprint(os.getuid())").output != "0\n"
    finally:
        k.close()


def test_an_unsafe_setting_allowed_is_logged_once_per_server(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """``allow_unsafe`` starts the kernel, and a warning names each setting weaker than the
    default: once for the server, not per episode."""
    sandbox = {"pid_namespace": False, "allow_unsafe": True}
    with caplog.at_level("WARNING", logger="tools.fork_server"):
        kernels = [Kernel(tmp_path, timeout_s=5.0, sandbox=sandbox) for _ in range(2)]
    try:
        assert all(k.run("print(1)").output == "1\n" for k in kernels)
        warned = [r.getMessage() for r in caplog.records if "weaker than the default" in r.getMessage()]
        assert len(warned) == 1 and "pid_namespace=False" in warned[0] and "allow_unsafe=True" in warned[0]
    finally:
        for k in kernels:
            k.close()
