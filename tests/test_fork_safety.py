"""A forked child (a DataLoader worker) must not free a PyAV decoder the parent left in a reference
cycle: FFmpeg would wait there for slice threads a fork does not copy, and the worker would hang
(``episodestream._base.fork_safety``)."""

from __future__ import annotations

import gc
import multiprocessing
import os

import av
import pytest

from episodestream._base.fork_safety import freeze_inherited_objects_in_forked_children


def _collect_and_exit() -> None:
    gc.collect()
    os._exit(0)


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="needs os.register_at_fork (POSIX)")
def test_a_forked_child_does_not_free_a_threaded_decoder_it_inherited(dataset_root):
    freeze_inherited_objects_in_forked_children()
    video = next((dataset_root / "videos").rglob("*.mp4"))
    gc.disable()  # the container stays garbage in a cycle until the child runs
    try:
        container = av.open(str(video))
        stream = container.streams.video[0]
        stream.thread_type = "SLICE"
        stream.thread_count = 2
        next(container.decode(stream))  # the codec's slice threads exist now
        del container, stream
        child = multiprocessing.get_context("fork").Process(target=_collect_and_exit)
        child.start()
        child.join(timeout=60)
        hung = child.is_alive()
        if hung:
            child.kill()
    finally:
        gc.enable()
        gc.collect()
    assert not hung, "the forked child hung freeing the parent's PyAV decoder"
