"""What identifying a ``learn`` stage by its model's content costs: ``content_digest`` (sizes,
mtimes, small files whole, large files by their edges) against a full SHA-256 of every byte.

Usage: ``python benchmarks/stage_digest.py [PATH …]`` (default: the embedded SmolLM2 folder and
its packaged GGUF). Prints one line per path: size, both times and their ratio.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from deepanalyze_env.generation.models import embedded_gguf, resolve_model  # noqa: E402
from deepanalyze_env.learn import content_digest  # noqa: E402


def full_hash(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        with open(file, "rb") as fh:
            while chunk := fh.read(2**24):
                h.update(chunk)
    return h.hexdigest()


def timed(fn, path: Path, repeats: int) -> float:
    fn(path)  # warm the page cache: both are measured on cached files
    start = time.perf_counter()
    for _ in range(repeats):
        fn(path)
    return (time.perf_counter() - start) / repeats


def main(argv: list[str]) -> int:
    folder, filename = embedded_gguf("smollm2")
    paths = [Path(p) for p in argv] or [Path(resolve_model("embedded:smollm2")), folder / filename]
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        size = sum(p.stat().st_size for p in files)
        cheap, full = timed(content_digest, path, 10), timed(full_hash, path, 3)
        print(
            f"{path.name}: {size / 2**20:.0f} MiB, content_digest {cheap * 1000:.1f} ms, "
            f"full SHA-256 {full * 1000:.0f} ms ({full / cheap:.0f}x)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
