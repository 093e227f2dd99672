"""Batch memory reused once the trainer has let go of it, so frames are written into warm pages.

Large tensors are allocated with mmap and handed back to the kernel when freed, so every fresh
float32 batch pays a page fault per 4 KB it writes: converting a frame into fresh memory costs
several times what it costs into memory written before, a sizeable share of decoding it
(measured in benchmarks/LOG.md). Reusing a batch's memory is only safe once nothing can read it any more.

How that is guaranteed: the trainer never gets the tensor this module keeps, only a view of it
(``lend``). Every tensor that shares the memory, whatever made it (views, slices, ``.numpy()``,
DLPack, autograd's saved tensors), holds a reference on the storage, so the storage's use count
is back to what this module's own references account for only when every one of them is gone.
Handles that reach the memory without a tensor are Python references to this module's own
objects: the allocated tensor (a view's ``._base``) and the storage's Python object (what
``untyped_storage()`` and the deprecated ``.storage()`` return, or wrap); their reference counts
must be back to this module's own too.
Memory is reused only then, and never when it is pinned (PyTorch's pinned-memory allocator
already caches it and knows when asynchronous copies from it are done) or has been moved into
shared memory (another process may hold it). Where PyTorch does not expose the use count, nothing
is reused.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass

import torch

from episodestream._runtime.private_apis import storage_use_count


@dataclass
class _Lent:
    tensor: torch.Tensor  # the tensor this module allocated (never handed out)
    storage: torch.UntypedStorage  # held so the storage's Python object, and the count, stay put
    free_at: int  # the storage's use count once every tensor handed out is gone


class BatchMemory:
    """Up to ``capacity`` lent batch tensors, reused by ``empty`` once free (see the module doc)."""

    def __init__(self, *, capacity: int) -> None:
        self._capacity = capacity
        self._lent: list[_Lent] = []
        self._lock = threading.Lock()
        self.reused = 0  # tensors handed out again (for tests and benchmarks)
        # The use count of a storage held by one tensor and the storage's Python object alone,
        # measured here rather than assumed (it differs between PyTorch versions).
        # PyTorch has no public accessor for a storage's use count; without it, memory is not reused.
        self._use_count = use_count = storage_use_count()
        if use_count is not None:
            probe = torch.empty(1)
            self._own_count = use_count(probe.untyped_storage())
            # The Python references a lent entry holds alone, measured as ``_is_free`` reads them.
            alone = _Lent(probe, probe.untyped_storage(), 0)
            del probe
            self._own_refs = _python_refs(alone)

    def empty(self, shape: tuple[int, ...], *, dtype: torch.dtype, device: torch.device,
              pin_memory: bool) -> torch.Tensor:
        """An uninitialised tensor: lent memory nothing refers to any more, else a new one."""
        with self._lock:
            for i, lent in enumerate(self._lent):
                if (tuple(lent.tensor.shape) == shape and lent.tensor.dtype == dtype
                        and lent.tensor.device == device and self._is_free(lent)):
                    del self._lent[i]
                    self.reused += 1
                    return lent.tensor
        return torch.empty(shape, dtype=dtype, device=device, pin_memory=pin_memory and device.type == "cpu")

    def lend(self, tensor: torch.Tensor, rows: int) -> torch.Tensor:
        """A view of ``tensor``'s first ``rows`` rows for the trainer; ``tensor`` is remembered for
        reuse once that view and everything made from it are gone.

        Call it when nothing but ``tensor`` refers to its memory: the count measured then is the
        one that means "free". Anything else holding it then (a numpy view left alive, say) makes
        the count differ from a lone tensor's, and the memory is simply not reused.
        """
        use_count = self._use_count
        if use_count is None or tensor.device.type != "cpu" or tensor.is_pinned():
            return tensor[:rows] if rows < tensor.shape[0] else tensor.view(tensor.shape)
        storage = tensor.untyped_storage()
        alone = use_count(storage) == self._own_count
        view = tensor[:rows] if rows < tensor.shape[0] else tensor.view(tensor.shape)
        if alone:
            with self._lock:
                self._lent.append(_Lent(tensor, storage, self._own_count))
                if len(self._lent) > self._capacity:
                    del self._lent[0]  # forgotten, not reused: freed whenever the trainer drops it
        return view

    def _is_free(self, lent: _Lent) -> bool:
        # Only lent while the use count exists (``lend`` keeps nothing without it).
        use_count = self._use_count
        return (use_count is not None and not lent.storage.is_shared()
                and use_count(lent.storage) <= lent.free_at
                and all(now <= own for now, own in zip(_python_refs(lent), self._own_refs)))


def _python_refs(lent: _Lent) -> tuple[int, int]:
    """Python references to ``lent``'s tensor and storage objects (a view's ``_base``, a storage
    handle and its TypedStorage wrapper each add one)."""
    return sys.getrefcount(lent.tensor), sys.getrefcount(lent.storage)
