"""Forked children leave what they inherited to the parent: ``gc.freeze()`` first thing after a fork.

A DataLoader worker is a fork of the trainer's process and inherits its heap, garbage included. A
PyAV container whose decoder ran FFmpeg's slice threads, left in a reference cycle in the parent (its
streams and container refer to each other, so only the cyclic collector frees it), is freed by the
child's first full collection: FFmpeg then waits for slice threads that a fork does not copy, and the
worker hangs for good (seen in the suite: two workers idle in ``avpriv_slicethread_free`` under
``gc_collect_main``). Freezing every inherited object in the child, before any of its own code runs,
keeps the collector off them: what the parent left is the parent's to free. It also keeps the child's
collections from writing to the inherited pages (copy-on-write), as Python's ``gc.freeze`` docs advise
around ``fork``; the cost is that cyclic garbage inherited by a child is not freed in that child.

A process-wide hook, registered once per process (``functools.cache``) when a dataset is built.
"""

from __future__ import annotations

import functools
import gc
import os


@functools.cache
def freeze_inherited_objects_in_forked_children() -> None:
    """Register ``gc.freeze`` to run in every child forked from this process from now on."""
    os.register_at_fork(after_in_child=gc.freeze)
