"""A mixture consumer's pass as a ``ConsumerStream``: the components' planned samples, interleaved
in the consumer's order, keys renamed and ``dataset_index`` added.

Each component plans its own steps through its own pool (``_DatasetStream``). The mixture's order
switches component every sample or two, so groups of one component's samples would be one or two
samples long and decoding would lose its grouping (one decoder call per file per group; an epoch in
groups of 1 takes much longer than in groups of 8, benchmarks/LOG.md). So the mixture's groups
are runs of ``decode_group_size`` consecutive samples of any components, whose builder
(``MixedBuilder``) decodes each component's part with that component's builder and decoders
(``ComponentDecoders``). A component group's evicted episodes travel with its last sample, as
(component, episode) pairs, and are released per component once that sample is decoded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from episodestream._sample.builder import PendingSample, as_tensor
from episodestream._format.metadata import EpisodeInfo
from episodestream._runtime.mixture.schema import ComponentAdapter
from episodestream._runtime.stream import ConsumerStream, DecoderSet, GroupBuilder, PlannedGroup
from episodestream._sample.video.decoder_cache import DecodedFile, DecoderCache, FrameQuery


class _Renamer:
    """A component's keys to the mixture's (``{its key: mixture key}``), pad masks alike."""

    def __init__(self, rename: Mapping[str, str]) -> None:
        self.forward = {**rename, **{f"{k}_is_pad": f"{v}_is_pad" for k, v in rename.items()}}
        self.backward = {v: k for k, v in self.forward.items()}

    def keys(self, mapping: Mapping[str, Any], table: Mapping[str, str]) -> dict[str, Any]:
        return {table.get(k, k): v for k, v in mapping.items()}


class ComponentBuilder:
    """A component's ``SampleBuilder`` for samples whose keys the mixture renamed: decoding and
    in-place frame writes as the component's; ``finish`` runs the component's own (its
    ``image_transforms`` name its own keys) and renames the result."""

    def __init__(self, inner: GroupBuilder, renamer: _Renamer | None, adapter: ComponentAdapter | None) -> None:
        self._inner, self._renamer, self._adapter = inner, renamer, adapter
        # Keys the mixture added to the planned sample: kept out of the component's finish, where
        # renaming back could make one meet a key of the component's own.
        self._added = adapter.added_keys() if adapter is not None else set()
        self.frame_dtype = inner.frame_dtype
        self.writes_in_place = inner.writes_in_place
        self.decode = inner.decode
        self.frame_writer = inner.frame_writer

    def finish(self, pending: PendingSample, frames: Sequence[torch.Tensor]) -> dict[str, Any]:
        renamer, adapter = self._renamer, self._adapter
        if renamer is None:
            sample = self._inner.finish(pending, frames)
        else:
            added = {k: v for k, v in pending.item.items() if k in self._added}
            item = {k: v for k, v in pending.item.items() if k not in self._added}
            own = PendingSample(renamer.keys(item, renamer.backward),
                                [renamer.backward.get(k, k) for k in pending.video_keys],
                                pending.windowed, pending.queries, pending.task)
            sample = renamer.keys(self._inner.finish(own, frames), renamer.forward)
            sample.update((key, as_tensor(value)) for key, value in added.items())
        if adapter is None:
            return sample
        for key in adapter.drop:
            sample.pop(key, None)
            sample.pop(f"{key}_is_pad", None)
        return adapter.resized(sample)

    def tabular(self, pending: PendingSample) -> dict[str, Any]:
        return self._inner.tabular(pending)  # its keys were renamed when it was planned


class ComponentDecoders:
    """One decode thread's decoders: its share of each component's ``DecoderCache``, by component."""

    def __init__(self, caches: Sequence[DecoderSet]) -> None:
        self._caches = list(caches)

    def __getitem__(self, component: int) -> DecoderSet:
        return self._caches[component]

    def caches(self) -> list[DecoderCache]:
        return [cache for decoders in self._caches for cache in decoders.caches()]

    def close(self) -> None:
        for cache in self._caches:
            cache.close()


class MixedBuilder:
    """The builder of groups mixing components: each sample decoded and finished by its own
    component's builder (``dataset_index`` says which), files decoded once per component part."""

    def __init__(self, builders: Sequence[ComponentBuilder], *, frames_in_place: bool = True) -> None:
        self._builders = list(builders)
        # In-place frame writes need one conversion for all (the loader checks every builder).
        self.frame_dtype = builders[0].frame_dtype
        self.writes_in_place = frames_in_place and all(b.writes_in_place for b in builders)
        self.frame_writer = builders[0].frame_writer

    def decode(self, caches: ComponentDecoders, pendings: Sequence[PendingSample]) -> dict[str, DecodedFile]:
        # Each file once, by the first component that wants it: two components may select episodes
        # of one folder, and one decoder call for all its frames beats one per component.
        owner: dict[str, int] = {}
        queries: dict[int, list[FrameQuery]] = {}
        for pending in pendings:
            component = int(pending.item["dataset_index"])
            for query in pending.queries:
                queries.setdefault(owner.setdefault(query.path, component), []).append(query)
        decoded: dict[str, DecodedFile] = {}
        for component, wanted in queries.items():
            carrier = PendingSample({}, [], [], wanted, "")  # SampleBuilder.decode reads only the queries
            decoded.update(self._builders[component].decode(caches[component], [carrier]))
        return decoded

    def tabular(self, pending: PendingSample) -> dict[str, Any]:
        return self._builders[int(pending.item["dataset_index"])].tabular(pending)

    def finish(self, pending: PendingSample, frames: Sequence[torch.Tensor]) -> dict[str, Any]:
        return self._builders[int(pending.item["dataset_index"])].finish(pending, frames)


class MixtureStream(ConsumerStream):
    """One consumer's pass over a mixture (see the module docstring)."""

    def __init__(self, streams: Sequence[ConsumerStream], order: np.ndarray, *,
                 renames: Sequence[Mapping[str, str]], group_size: int, finished: Callable[[], None],
                 adapters: Sequence[ComponentAdapter] | None = None, frames_in_place: bool = True) -> None:
        self._streams = list(streams)
        self._order = order
        self._group_size = self.group_size = group_size
        self._renamers = [_Renamer(r) if r else None for r in renames]
        self._adapters: list[ComponentAdapter | None] = list(adapters) if adapters is not None else [None] * len(streams)
        self.builder = MixedBuilder([ComponentBuilder(s.builder, r, a) for s, r, a in
                                     zip(self._streams, self._renamers, self._adapters)],
                                    frames_in_place=frames_in_place)
        self._finished = finished
        self.num_samples = len(order)
        self.num_cameras = self._streams[0].num_cameras
        self.decoders_outlive_pass = all(stream.decoders_outlive_pass for stream in self._streams)
        self._groups: Iterator[PlannedGroup] | None = None

    def groups(self) -> Iterator[PlannedGroup]:
        if self._groups is None:
            self._groups = self._interleave()
        return self._groups

    def _pending(self, component: int, pending: PendingSample) -> PendingSample:
        renamer = self._renamers[component]
        item = pending.item if renamer is None else renamer.keys(pending.item, renamer.forward)
        item["dataset_index"] = np.array(component, dtype=np.int64)  # a tensor in the sample (as_tensor)
        keys = pending.video_keys if renamer is None else [renamer.forward.get(k, k) for k in pending.video_keys]
        adapter = self._adapters[component]
        if adapter is None:
            return PendingSample(item, keys, pending.windowed, pending.queries, pending.task)
        item = adapter.adapt_item(item, self.builder.frame_dtype)
        # Cameras the mixture leaves out are not decoded, unless the component's image_transforms
        # expect them (then ComponentBuilder.finish drops them after).
        kept = [j for j, key in enumerate(keys)
                if key not in adapter.drop or not self._streams[component].builder.writes_in_place]
        if len(kept) == len(keys):
            return PendingSample(item, keys, pending.windowed, pending.queries, pending.task)
        return PendingSample(item, [keys[j] for j in kept], [pending.windowed[j] for j in kept],
                             [pending.queries[j] for j in kept], pending.task)

    def _interleave(self) -> Iterator[PlannedGroup]:
        # Per component: its planned samples not yet handed on, each with the episodes its group
        # evicted (on the group's last sample) and the component's groups not yet pulled.
        ready: list[deque[tuple[PendingSample, list]]] = [deque() for _ in self._streams]
        sources = [s.groups() if s.num_samples else iter(()) for s in self._streams]
        carried: list[tuple[int, EpisodeInfo]] = []  # evictions of sample-less groups, handed on with the next group

        def pull(component: int) -> None:
            while not ready[component]:
                group = next(sources[component])
                gone = [(component, episode) for episode in group.evicted]
                if not group.pendings:
                    carried.extend(gone)
                    continue
                last = len(group.pendings) - 1
                ready[component].extend((p, gone if i == last else []) for i, p in enumerate(group.pendings))

        order = self._order.tolist()
        for start in range(0, len(order), self._group_size):
            pendings, evicted = [], carried[:]
            carried.clear()
            for component in order[start:start + self._group_size]:
                pull(component)
                pending, gone = ready[component].popleft()
                pendings.append(self._pending(component, pending))
                evicted.extend(gone)
            yield PlannedGroup(pendings, evicted)
        # What the components still evict after their last samples.
        for component, groups in enumerate(sources):
            for group in groups:
                carried.extend((component, episode) for episode in group.evicted)
        if carried:
            yield PlannedGroup([], carried)

    def open_decoders(self, threads: int = 1) -> ComponentDecoders:
        return ComponentDecoders([stream.open_decoders(threads) for stream in self._streams])

    def release(self, group: PlannedGroup) -> None:
        by_component: dict[int, list[EpisodeInfo]] = {}
        for component, episode in group.evicted:  # (component, episode) pairs: groups() makes them so
            by_component.setdefault(component, []).append(episode)
        for component, episodes in by_component.items():
            self._streams[component].release(PlannedGroup([], episodes))

    def finished(self) -> None:
        self._finished()

    def close(self) -> None:
        if self._groups is not None:
            self._groups.close()  # type: ignore[attr-defined]  # a generator
        for stream in self._streams:
            stream.close()
