"""Resume scenarios whose sample order is recorded in ``tests/data/resume_orders.json``.

Each scenario saves a state partway through an epoch (at batch k, with 0 or 2 DataLoader workers,
persistent workers, an ``EpisodeLoader``, a ``StatefulDataLoader``, a mixture), resumes it (with the
same and with other worker counts), and returns the (episode_index, frame_index) of every sample the
resumed run yields, in order, through the next epoch too. ``tests/test_resume_orders.py`` runs them
and compares with the JSON, which was written by the code before the resume record (issue 66 item 1,
commit d0e64df): the same samples in the same order for the same seeds.

Regenerate (only where an order is meant to change, saying why in the commit):
    python -m tests.resume_orders tests/data/resume_orders.json
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch.utils.data

LENGTHS = (7, 1, 12, 3, 9, 1, 15, 4, 6, 2, 11, 5, 8, 1, 13, 3, 10, 6, 2, 14)
BATCH = 4


def write_datasets(root: Path) -> tuple[Path, Path]:
    """Two camera-less datasets (written in well under a second): the main one and a mixture's second."""
    from episodestream.tools.synthetic import write_tabular_dataset

    first, second = root / "first", root / "second"
    write_tabular_dataset(first, num_episodes=len(LENGTHS), episode_length=list(LENGTHS), episodes_per_data_file=5)
    write_tabular_dataset(second, num_episodes=8, episode_length=[5, 9, 2, 7, 11, 3, 6, 4], episodes_per_data_file=4)
    return first, second


def _dataset(root: Path, **options):
    from episodestream import EpisodeStreamingDataset

    options.setdefault("episode_pool_size", 3)
    return EpisodeStreamingDataset(root, seed=7, **options)


def _pairs(batch) -> list[list[int]]:
    return [[int(e), int(f)] for e, f in zip(batch["episode_index"], batch["frame_index"])]


def _collate(samples):
    return {"episode_index": [int(s["episode_index"]) for s in samples],
            "frame_index": [int(s["frame_index"]) for s in samples]}


def _loader(dataset, num_workers: int, **options):
    return torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=num_workers, collate_fn=_collate,
                                       **options)


def _run(loader, epochs: int = 2) -> list[list[int]]:
    """Every sample of ``epochs`` passes of ``loader``."""
    return [pair for _ in range(epochs) for batch in loader for pair in _pairs(batch)]


def _save_dataloader(root: Path, *, workers: int, k: int, persistent: bool = False, into_next: bool = False):
    """A trainer's state (``stream_state``) after ``k`` batches of a DataLoader with ``workers``."""
    from episodestream import stream_state

    dataset = _dataset(root)
    loader = _loader(dataset, workers, persistent_workers=persistent and workers > 0)
    if into_next:
        list(loader)
    iterator = iter(loader)
    list(itertools.islice(iterator, k))
    state = json.loads(json.dumps(stream_state(loader, k)))
    del iterator
    return state


def dataloader_resume(root: Path, *, save_workers: int, k: int, resume_workers: int, persistent: bool = False,
                      into_next: bool = False) -> list[list[int]]:
    state = _save_dataloader(root, workers=save_workers, k=k, persistent=persistent, into_next=into_next)
    dataset = _dataset(root)
    dataset.load_state_dict(state)
    return _run(_loader(dataset, resume_workers, persistent_workers=persistent and resume_workers > 0))


def episode_loader_resume(root: Path, *, k: int, from_dataloader_workers: int | None = None) -> list[list[int]]:
    from episodestream import EpisodeLoader

    if from_dataloader_workers is not None:
        state = _save_dataloader(root, workers=from_dataloader_workers, k=k)
    else:
        loader = EpisodeLoader(_dataset(root), batch_size=BATCH, num_threads=2)
        iterator = iter(loader)
        list(itertools.islice(iterator, k))
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    resumed = EpisodeLoader(_dataset(root), batch_size=BATCH, num_threads=2)
    resumed.load_state_dict(state)
    try:
        return [[int(e), int(f)] for _ in range(2) for batch in resumed
                for e, f in zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())]
    finally:
        resumed.close()


def stateful_resume(root: Path, *, save_workers: int, k: int, resume_workers: int) -> list[list[int]]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from episodestream import load_loader_state

    def make():
        return StatefulDataLoader(_dataset(root), batch_size=BATCH, num_workers=save_workers, collate_fn=_collate)

    loader = make()
    iterator = iter(loader)
    list(itertools.islice(iterator, k))
    state = loader.state_dict()
    del iterator
    resumed = StatefulDataLoader(_dataset(root), batch_size=BATCH, num_workers=resume_workers, collate_fn=_collate)
    load_loader_state(resumed, state)
    return _run(resumed)


def mixture_resume(roots: tuple[Path, Path], *, save_workers: int, k: int, resume_workers: int) -> list[list[int]]:
    from episodestream import EpisodeMixture, stream_state

    def mixture():
        return EpisodeMixture([_dataset(roots[0]), _dataset(roots[1], episode_pool_size=2)], weights=[0.6, 0.4],
                              seed=11)

    def collate(samples):
        return {**_collate(samples), "dataset_index": [int(s["dataset_index"]) for s in samples]}

    loader = torch.utils.data.DataLoader(mixture(), batch_size=BATCH, num_workers=save_workers, collate_fn=collate)
    iterator = iter(loader)
    list(itertools.islice(iterator, k))
    state = json.loads(json.dumps(stream_state(loader, k)))
    del iterator
    resumed = mixture()
    resumed.load_state_dict(state)
    loader = torch.utils.data.DataLoader(resumed, batch_size=BATCH, num_workers=resume_workers, collate_fn=collate)
    return [[d, e, f] for _ in range(2) for batch in loader
            for d, e, f in zip(batch["dataset_index"], batch["episode_index"], batch["frame_index"])]


def persistent_reload(root: Path) -> list[list[int]]:
    """A DataLoader with persistent workers iterates an epoch, then a state is loaded into its dataset
    and a new DataLoader (persistent too) built after the load resumes it."""
    dataset = _dataset(root)
    loader = _loader(dataset, 2, persistent_workers=True)
    first = _run(loader, 1)
    dataset.load_state_dict(_save_dataloader(root, workers=2, k=3))
    return first + _run(_loader(dataset, 2, persistent_workers=True))


def scenarios(roots: tuple[Path, Path]) -> dict[str, Callable[[], list[list[int]]]]:
    root = roots[0]
    return {
        "dataloader 0 workers at batch 5 -> 0 workers": lambda: dataloader_resume(root, save_workers=0, k=5,
                                                                                  resume_workers=0),
        "dataloader 0 workers at batch 5 -> 2 workers": lambda: dataloader_resume(root, save_workers=0, k=5,
                                                                                  resume_workers=2),
        "dataloader 2 workers at batch 7 -> 2 workers": lambda: dataloader_resume(root, save_workers=2, k=7,
                                                                                  resume_workers=2),
        "dataloader 2 workers at batch 7 -> 1 worker": lambda: dataloader_resume(root, save_workers=2, k=7,
                                                                                 resume_workers=1),
        "dataloader 2 workers at batch 3 of epoch 1 -> 2 workers": lambda: dataloader_resume(
            root, save_workers=2, k=3, resume_workers=2, into_next=True),
        "dataloader persistent 2 workers at batch 6 -> persistent 2 workers": lambda: dataloader_resume(
            root, save_workers=2, k=6, resume_workers=2, persistent=True),
        "dataloader persistent 2 workers at batch 6 -> 0 workers": lambda: dataloader_resume(
            root, save_workers=2, k=6, resume_workers=0, persistent=True),
        "persistent workers, then a load and a new DataLoader": lambda: persistent_reload(root),
        "EpisodeLoader at batch 4 -> EpisodeLoader": lambda: episode_loader_resume(root, k=4),
        "dataloader 2 workers at batch 5 -> EpisodeLoader": lambda: episode_loader_resume(
            root, k=5, from_dataloader_workers=2),
        "StatefulDataLoader 0 workers at batch 6 -> 0 workers": lambda: stateful_resume(root, save_workers=0, k=6,
                                                                                        resume_workers=0),
        "StatefulDataLoader 2 workers at batch 6 -> 2 workers": lambda: stateful_resume(root, save_workers=2, k=6,
                                                                                        resume_workers=2),
        "StatefulDataLoader 2 workers at batch 6 -> 1 worker": lambda: stateful_resume(root, save_workers=2, k=6,
                                                                                       resume_workers=1),
        "mixture 2 workers at batch 5 -> 2 workers": lambda: mixture_resume(roots, save_workers=2, k=5,
                                                                            resume_workers=2),
        "mixture 0 workers at batch 5 -> 2 workers": lambda: mixture_resume(roots, save_workers=0, k=5,
                                                                            resume_workers=2),
    }


def record(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        roots = write_datasets(Path(tmp))
        orders = {name: run() for name, run in scenarios(roots).items()}
    out.write_text(json.dumps(orders, indent=None, separators=(",", ":")).replace("]],", "]],\n") + "\n")


if __name__ == "__main__":
    record(Path(sys.argv[1]))
