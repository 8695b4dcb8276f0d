"""Bounded capture of a cell's output: keep the head and the tail, count what was dropped.

The env drains the pipe continuously while a cell runs (so a chatty cell never blocks on a
full pipe) but memory stays bounded by ``max_chars`` however much the cell prints.
"""

from __future__ import annotations


class CappedOutput:
    """A cell's output kept as head and tail within a byte cap while the pipe is drained, so a cell that
    prints gigabytes costs bounded memory and never blocks."""

    def __init__(self, max_chars: int):
        self.max_chars = max(int(max_chars), 0)
        self._head_cap = self.max_chars // 2
        self._tail_cap = self.max_chars - self._head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self._tail_cap:
            self._tail += chunk
            if len(self._tail) > self._tail_cap:
                del self._tail[: len(self._tail) - self._tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self._head) + len(self._tail)

    def text(self) -> str:
        head = self._head.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + self._tail.decode("utf-8", errors="replace")
        tail = self._tail.decode("utf-8", errors="replace")
        omitted = self.total_bytes - len(self._head) - len(self._tail)
        return f"{head}\n... [output truncated: {omitted} bytes omitted] ...\n{tail}"
