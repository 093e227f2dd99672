"""Other libraries' private APIs, each behind a small adapter that checks it before use.

Two are used, because neither library has a public way to do what is needed:
- ``torch._C._storage_Use_Count``: a storage's use count, which tells when the trainer has let go of
  every view of a batch (``batch_memory``). Checked by behaviour when first asked for: a view must
  raise the count by one and dropping it lower it again; anywhere else (a PyTorch without it, or
  where it counts otherwise), batch memory is simply not reused.
- torchdata's ``StatefulDataLoader`` state layout (``loader_state``): its keys are the private
  constants of torchdata's classes. They are read from the installed torchdata where it is
  importable, and checked against the layout verified (torchdata 0.11); a torchdata that renamed them
  makes ``torchdata_state_keys`` raise, naming the version, instead of misreading a checkpoint.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# torchdata's state keys as verified with torchdata 0.11 (stateful_dataloader.py, incremental_state.py).
TORCHDATA_KEYS = {"snapshot": "_snapshot", "main": "_main_snapshot", "workers": "_worker_snapshots",
                   "num_workers": "_num_workers", "steps_since": "_steps_since_snapshot",
                   "dataset": "dataset_state", "single_yielded": "_num_yielded"}
_TORCHDATA_CONSTANTS = {"snapshot": ("_StatefulMultiProcessingDataLoaderIter", "_SNAPSHOT"),
                        "main": ("_StatefulMultiProcessingDataLoaderIter", "_MAIN_SNAPSHOT"),
                        "workers": ("_StatefulMultiProcessingDataLoaderIter", "_WORKER_SNAPSHOTS"),
                        "num_workers": ("_StatefulMultiProcessingDataLoaderIter", "_NUM_WORKERS"),
                        "steps_since": ("_StatefulMultiProcessingDataLoaderIter", "_STEPS_SINCE_SNAPSHOT"),
                        "single_yielded": ("_StatefulSingleProcessDataLoaderIter", "_NUM_YIELDED")}


@functools.lru_cache(maxsize=1)
def storage_use_count() -> Callable[[torch.UntypedStorage], int] | None:
    """``count(storage)``: how many tensors and handles share ``storage`` (PyTorch's own count), or None
    where this PyTorch does not have it or it does not behave as checked here."""
    private = getattr(torch._C, "_storage_Use_Count", None)
    if private is None:
        return None

    def count(storage: torch.UntypedStorage) -> int:
        return int(private(storage._cdata))

    try:
        probe = torch.empty(1)
        storage = probe.untyped_storage()
        alone = count(storage)
        view = probe.view(1)
        with_view = count(storage)
        del view
        if (with_view, count(storage)) != (alone + 1, alone):
            return None
    except Exception:  # a private API that changed its signature: do without it
        return None
    return count


@functools.lru_cache(maxsize=1)
def torchdata_state_keys() -> dict[str, str]:
    """The keys of a ``StatefulDataLoader`` state read by ``loader_state``: the installed torchdata's
    own constants where it is importable (they must be the verified ones), else the verified ones
    (a state can be read without torchdata installed)."""
    try:
        import torchdata
        from torchdata.stateful_dataloader import incremental_state, stateful_dataloader
    except ImportError:
        return dict(TORCHDATA_KEYS)
    found: dict[str, Any] = {name: getattr(getattr(stateful_dataloader, cls, None), constant, None)
                             for name, (cls, constant) in _TORCHDATA_CONSTANTS.items()}
    found["dataset"] = getattr(incremental_state, "_DATASET_STATE", None)
    if found != TORCHDATA_KEYS:
        changed = {k: v for k, v in found.items() if v != TORCHDATA_KEYS[k]}
        raise RuntimeError(f"torchdata {getattr(torchdata, '__version__', '?')} lays out StatefulDataLoader states "
                           f"otherwise than the torchdata 0.11 layout episodestream reads ({changed}); resuming from "
                           f"its states is not supported with this version. Pin torchdata 0.11, or save "
                           f"stream_state(loader, batches_consumed) instead.")
    return found
