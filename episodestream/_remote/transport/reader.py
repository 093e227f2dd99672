"""One path for "give me these byte ranges of this file", for any fsspec filesystem.

``fetch_range`` is the single function every remote byte goes through (so the download controller
can wrap it: pass ``fetch=`` to ``ChunkedReader``). ``ChunkedReader`` adds, per process: a small
LRU of recently read pieces (parquet footers, mp4 box headers are read again and again), widening of
small reads to one block so a run of small reads becomes one request, and counters. ``RangedFile`` is a read-only, seekable file object over it, which
pyarrow reads parquet footers and row groups from.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import fsspec
from fsspec.asyn import AsyncFileSystem

from episodestream._remote.transport.failures import TransferInterrupted

FetchFn = Callable[[fsspec.AbstractFileSystem, str, int, int], bytes]

BLOCK_BYTES = 64 * 1024  # a small read fetches this much from its offset on (footers, box headers)
CACHED_PIECE_MAX_BYTES = 1024 * 1024  # larger reads are not kept: they are video spans or row groups
CACHE_BYTES = 16 * 1024 * 1024  # per process
LARGE_READ_BYTES = 32 * 1024 * 1024  # a larger range is fetched in pieces of this size (memory)
KEEP_CONCURRENT_READS = 8  # ``keep``'s requests in flight at once (the node's request budget starts at 8)


def fetch_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``path``: one ranged GET on object stores, a positioned read locally.

    Async filesystems (s3fs, gcsfs, http) implement ``cat_file`` as exactly one ranged request. The
    others read through a file opened without read-ahead: HfFileSystem otherwise fetches 5 MiB
    blocks whatever the read size.
    """
    if end <= start:
        return b""
    if isinstance(fs, AsyncFileSystem):
        return exact_range(fs.cat_file(path, start=start, end=end), start, end)
    # ``size=end`` spares the filesystem a request for the real size: nothing past ``end`` is read.
    with fs.open(path, "rb", cache_type="none", size=end) as file:
        file.seek(start)
        return exact_range(file.read(end - start), start, end)


def exact_range(body: bytes, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` from the answer to a ranged read: cut from the whole file where the
    server ignored ``Range`` (a plain HTTP server answers 200 with everything); a body that came
    short raises ``TransferInterrupted`` (retried like a reset: a connection that closed cleanly
    early, or a file that changed since it was listed)."""
    if len(body) != end - start and len(body) >= end:
        body = body[start:end]
    if len(body) != end - start:
        raise TransferInterrupted(f"asked for bytes {start}..{end} ({end - start}), got {len(body)} (the body "
                                  f"came short, or the file changed since it was listed)")
    return body


@dataclass(frozen=True)
class ReadStats:
    """What a reader cost: requests made and bytes received, and reads served from its in-memory
    pieces (``memory_hits``; not the node cache's hits, which ``NodeCache.stats`` counts)."""

    requests: int = 0
    bytes_fetched: int = 0
    memory_hits: int = 0


class ChunkedReader:
    """Ranged reads of one filesystem's files, with a small LRU of pieces; thread-safe.

    ``sizes`` maps each path to its size in bytes (from the listing), so no read asks for bytes
    past the end and no request is spent on a file's size.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, sizes: Callable[[str], int], *,
                 fetch: FetchFn = fetch_range, block_bytes: int = BLOCK_BYTES,
                 cache_bytes: int = CACHE_BYTES) -> None:
        self._fs = fs
        self._size = sizes
        self._fetch = fetch
        self._block_bytes = block_bytes
        self._cache_bytes = cache_bytes
        self._pieces: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._held_bytes = 0
        self._lock = threading.Lock()
        self._requests = self._bytes = self._hits = 0

    def stats(self) -> ReadStats:
        with self._lock:
            return ReadStats(self._requests, self._bytes, self._hits)

    def size(self, path: str) -> int:
        return self._size(path)

    def _get(self, path: str, start: int, end: int) -> bytes | None:
        with self._lock:
            for (piece_path, piece_start), data in self._pieces.items():
                if piece_path == path and piece_start <= start and end <= piece_start + len(data):
                    self._pieces.move_to_end((piece_path, piece_start))
                    self._hits += 1
                    return data[start - piece_start:end - piece_start]
        return None

    def _put(self, path: str, start: int, data: bytes) -> None:
        with self._lock:
            old = self._pieces.pop((path, start), None)
            self._held_bytes -= len(old) if old is not None else 0
            self._pieces[(path, start)] = data
            self._held_bytes += len(data)
            while self._held_bytes > self._cache_bytes and self._pieces:
                _, dropped = self._pieces.popitem(last=False)
                self._held_bytes -= len(dropped)

    def _fetch_counted(self, path: str, start: int, end: int) -> bytes:
        data = self._fetch(self._fs, path, start, end)  # the whole range, or raises (``exact_range``)
        with self._lock:
            self._requests += 1
            self._bytes += len(data)
        return data

    def read(self, path: str, start: int, end: int, *, exact: bool = False, block_bytes: int | None = None) -> bytes:
        """Bytes ``[start, end)`` (clipped to the file). A read smaller than a block fetches a whole
        block from ``start`` (``block_bytes``, default the reader's) and keeps it; ``exact`` fetches
        just the range and keeps nothing (video spans)."""
        block_bytes = self._block_bytes if block_bytes is None else block_bytes
        size = self._size(path)
        start, end = max(0, start), min(end, size)
        if end <= start:
            return b""
        if not exact:
            cached = self._get(path, start, end)
            if cached is not None:
                return cached
            if end - start < block_bytes:
                block_end = min(size, start + block_bytes)
                data = self._fetch_counted(path, start, block_end)
                self._put(path, start, data)
                return data[:end - start]
        if end - start <= LARGE_READ_BYTES:
            data = self._fetch_counted(path, start, end)
        else:
            data = b"".join(self._fetch_counted(path, s, min(end, s + LARGE_READ_BYTES))
                            for s in range(start, end, LARGE_READ_BYTES))
        if not exact and len(data) <= CACHED_PIECE_MAX_BYTES:
            self._put(path, start, data)
        return data

    def keep(self, path: str, reads: list[tuple[int, int]]) -> None:
        """Fetch ``reads`` (byte ranges, one request each, ``KEEP_CONCURRENT_READS`` at once) and
        keep them as pieces, for the reads that follow inside them (a parquet reader's row groups,
        ``RowReader.read_many``). Ranges longer than a kept piece are skipped, and so are those past
        half the reader's cache (kept, they would push the first ones out before they are read):
        the read that wants them fetches them itself. The first error is raised once all reads ended."""
        wanted, wanted_bytes = [], 0
        for start, end in reads:
            if 0 < end - start <= CACHED_PIECE_MAX_BYTES and self._get(path, start, end) is None:
                wanted_bytes += end - start
                if wanted_bytes > self._cache_bytes // 2:
                    break
                wanted.append((start, end))
        pending = iter(wanted)
        lock = threading.Lock()
        errors: list[BaseException] = []

        def run() -> None:
            while not errors:
                with lock:
                    read = next(pending, None)
                if read is None:
                    return
                try:
                    self._put(path, read[0], self._fetch_counted(path, *read))
                except BaseException as error:  # raised below, in the caller
                    errors.append(error)

        # Daemon threads, not an executor's (``DaemonPool``'s reason): a stalled read must not
        # hold the interpreter's exit. Their round trips overlap; the request budget is the
        # download controller's.
        threads = [threading.Thread(target=run, name="episodestream-read-ahead", daemon=True)
                   for _ in range(min(KEEP_CONCURRENT_READS, len(wanted)) - 1)]
        for thread in threads:
            thread.start()
        run()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def open(self, path: str) -> RangedFile:
        return RangedFile(self, path)


class RangedFile(io.RawIOBase):
    """A read-only, seekable file object whose reads are ranged reads through a ``ChunkedReader``."""

    def __init__(self, reader: ChunkedReader, path: str) -> None:
        super().__init__()
        self._reader = reader
        self.name = path
        self._size = reader.size(path)
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def size(self) -> int:
        return self._size

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: cannot seek to {base + offset}, before the start")
        self._position = base + offset
        return self._position

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        data = self._reader.read(self.name, self._position, end)
        self._position += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)
