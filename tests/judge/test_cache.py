"""The SQLite reply cache: stable keys, first reply kept, several processes writing at once."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from rewards.judge import JudgeCache, cache_key


def test_key_depends_on_model_prompt_sampling_and_sample_only():
    base = cache_key("m", "p", 0.0, 100, 0)
    assert base == cache_key("m", "p", 0, 100, 0)
    assert len({base, cache_key("m2", "p", 0.0, 100, 0), cache_key("m", "p2", 0.0, 100, 0)}) == 3
    assert len({base, cache_key("m", "p", 0.5, 100, 0), cache_key("m", "p", 0.0, 101, 0)}) == 3
    assert base != cache_key("m", "p", 0.0, 100, 1)


def test_first_reply_for_a_key_is_kept(tmp_path: Path):
    cache = JudgeCache(tmp_path / "c.sqlite")
    cache.put("k", "m", 0, "SCORE: 1")
    cache.put("k", "m", 0, "SCORE: 5")
    assert cache.get("k") == "SCORE: 1"
    assert cache.get("other") is None
    cache.close()


def test_cache_uses_wal_and_records_created_time(tmp_path: Path):
    path = tmp_path / "c.sqlite"
    cache = JudgeCache(path)
    cache.put("k", "m", 0, "SCORE: 1")
    assert cache.flush()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        created = conn.execute("SELECT created FROM judge_replies WHERE key='k'").fetchone()[0]
    assert created > 1.6e9
    cache.close()


def test_a_reply_is_visible_to_every_handle_in_the_process_before_it_is_committed(tmp_path: Path):
    path = tmp_path / "c.sqlite"
    first, second = JudgeCache(path), JudgeCache(path)
    first.put("k", "m", 0, "SCORE: 2")
    assert second.get("k") == "SCORE: 2"
    first.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT reply FROM judge_replies").fetchall() == [("SCORE: 2",)]


def test_many_puts_are_committed_in_batches_by_one_writer(tmp_path: Path):
    cache = JudgeCache(tmp_path / "c.sqlite")
    for i in range(2000):
        cache.put(f"k{i}", "m", 0, f"reply {i}")
    assert cache.flush(timeout=30)
    assert len(cache) == 2000
    assert cache.get("k1999") == "reply 1999"


def _writer(path: str, worker: int, count: int) -> None:
    cache = JudgeCache(path)
    for i in range(count):
        cache.put(f"{worker}-{i}", "m", 0, f"reply {worker} {i}")
    cache.close()


def test_several_processes_can_write_at_once(tmp_path: Path):
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, w, 150)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    cache = JudgeCache(path)
    assert len(cache) == 600
    assert cache.get("3-149") == "reply 3 149"
    cache.close()


# --- journal mode: WAL is unsafe on network filesystems (its index lives in shared memory) -----

MOUNTS = (
    "/dev/sda1 / ext4 rw,relatime 0 0\n"
    "fileserver:/export/runs /shared nfs4 rw,vers=4.2 0 0\n"
    "/dev/sdb1 /shared/local\\040disk xfs rw 0 0\n"
)


def journal_of(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def test_auto_journal_is_the_rollback_journal_on_a_network_filesystem():
    from rewards.judge.cache import resolve_journal

    assert resolve_journal(Path("/shared/team/judge.sqlite"), "auto", MOUNTS) == "delete"
    assert resolve_journal(Path("/home/me/judge.sqlite"), "auto", MOUNTS) == "wal"
    # the longest mount point wins: a local disk mounted inside the network share
    assert resolve_journal(Path("/shared/local disk/j.sqlite"), "auto", MOUNTS) == "wal"
    assert resolve_journal(Path("/home/me/judge.sqlite"), "delete", MOUNTS) == "delete"


def test_the_delete_journal_mode_is_applied_and_works(tmp_path: Path):
    path = tmp_path / "c.sqlite"
    cache = JudgeCache(path, journal="delete")
    cache.put("k", "m", 0, "SCORE: 3")
    assert cache.flush()
    assert journal_of(path) == "delete"
    assert not (tmp_path / "c.sqlite-wal").exists()
    assert JudgeCache(path, journal="delete").get("k") == "SCORE: 3"
    cache.close()


def test_a_bad_journal_setting_is_named():
    import pytest

    from rewards.judge import JudgeSettings
    from rewards.judge.errors import JudgeConfigError

    with pytest.raises(JudgeConfigError, match="cache_journal"):
        JudgeSettings.from_config({"backend": "openai", "model": "m", "cache_journal": "wall"})
