"""Shared fixtures: real kernels, real workspaces, the shipped data."""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rewards import Method, register_method
from tools.workspace import sweep_stale

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"


@pytest.fixture
def workspace_root(tmp_path: Path) -> Path:
    """A workspace_root with one task folder ``data/ws`` holding a small CSV."""
    folder = tmp_path / "root" / "data" / "ws"
    folder.mkdir(parents=True)
    (folder / "sales.csv").write_text("store,revenue\nA,10\nB,32\nA,5\n")
    return tmp_path / "root"


@pytest.fixture(autouse=True)
def _scratch(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    scratch = tmp_path_factory.mktemp("scratch")
    monkeypatch.setenv("DEEPANALYZE_SCRATCH", str(scratch))
    yield scratch
    # A test that SIGKILLs a trainer leaves its episodes' tmpfs mounted (a later run's sweep
    # takes them; this root has none): unmount and remove what dead processes left here.
    sweep_stale(scratch)


# The built-in qa method includes the analysis judge; tests that are not about judges use this
# judge-free variant (same deterministic components) so they need no judge server.
register_method(Method("qa_plain", ("qa_accuracy", "qa_exact"), weights={"qa_exact": 0.0}))


def qa_extras(**over) -> dict:
    extras = {
        "reward_spec": {"method": "qa_plain", "ground_truth": "B"},
        "data": "data",
        "workspace_id": "ws",
        "input_seq": "Which store has the highest revenue?",
    }
    extras.update(over)
    return extras


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once ``pid`` no longer exists (or is only a zombie awaiting its reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def pid_namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def host_pid(inner: int, ns: str | None) -> int | None:
    """The pid seen here of the process that a cell saw as ``inner`` inside PID namespace ``ns``
    (the worker's, read before the cell ran); None when no such process is left."""
    if ns is None or ns == pid_namespace(os.getpid()):
        return inner if os.path.exists(f"/proc/{inner}") else None
    for entry in os.listdir("/proc"):
        if entry.isdigit() and pid_namespace(entry) == ns:
            try:
                with open(f"/proc/{entry}/status") as fh:
                    nspid = next(line for line in fh if line.startswith("NSpid:"))
            except (OSError, StopIteration):
                continue
            if int(nspid.split()[-1]) == inner:
                return int(entry)
    return None


def wait_gone_inside(inner: int, ns: str | None, timeout: float = 5.0) -> bool:
    """``wait_gone`` for a pid a cell printed (its own namespace's numbering)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = host_pid(inner, ns)
        if pid is None or wait_gone(pid, timeout=0.05):
            return True
        time.sleep(0.05)
    return False


def play(env, *turns: str) -> dict:
    """Step ``env`` through ``turns`` and close it (even when a step raises); the last step's output."""
    try:
        for turn in turns:
            out = env.step(turn)
        return out
    finally:
        env.close()


def code(src: str) -> str:
    return f"<Analyze>step</Analyze>\n<Code>\n```python\n{src}\n```\n</Code>"


# --- a tokenizer built in the test: no downloads, a real transformers object -------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = [
    "<Analyze>I will load the data and look at it.</Analyze>",
    "<Code>\n```python\nimport pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(df.head())\n```\n</Code>",
    "<Answer>\nThe store with the highest revenue is B.\nAnswer: B\n</Answer>",
    "\n<Execute>\n[Error]:\nTraceback (most recent call last):\n",
    "NameError: name 'x' is not defined\n</Execute>\n",
    "store,revenue\nA,10\nB,32\n0 1 2 3 4 5 6 7 8 9 groupby sum mean",
]


def build_tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|pad|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|end|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


# SkyRL needs Python >= 3.12 and its own venv (scripts/test.sh builds .venv312 and runs them there).
collect_ignore = [] if importlib.util.find_spec("skyrl") else ["skyrl"]
