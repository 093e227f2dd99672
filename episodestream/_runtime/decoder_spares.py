"""``DecoderSpares``: a loader's decoders, kept from the end of one pass for the threads of the next.

``EpisodeLoader`` starts its decode threads for each pass, and each thread used to open its
decoders anew: at every pass's start every thread opened every camera's file again, and an open is
a run of short GIL-held calls that the other starting threads wait behind (benchmarks/LOG.md,
"A pass's start and end at 16 threads", measures what that cost each pass's start).
Now a starting thread takes a set left by the pass before, and an ending thread gives its set back.

Only for streams whose files stay as they are (``ConsumerStream.decoders_outlive_pass``: a local
dataset); a remote cache may delete a file or fetch another span under its name between passes, so
those sets are closed when their thread ends, as before. A set is used by one thread at a time: it
leaves the spares when taken and comes back only when its thread is done with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from episodestream._runtime.stream import DecoderSet


class DecoderSpares:
    """Decoder sets no thread is using, for the next thread that starts; ``close()`` closes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # threads of one pass start and end at once
        self._spares: list[DecoderSet] = []

    def take(self, open_decoders: Callable[[], DecoderSet]) -> DecoderSet:
        """A spare set, else ``open_decoders()``."""
        with self._lock:
            if self._spares:
                return self._spares.pop()
        return open_decoders()

    def give_back(self, decoders: DecoderSet) -> None:
        with self._lock:
            self._spares.append(decoders)

    def __len__(self) -> int:
        return len(self._spares)

    def close(self) -> None:
        with self._lock:
            spares, self._spares = self._spares, []
        for decoders in spares:
            decoders.close()
