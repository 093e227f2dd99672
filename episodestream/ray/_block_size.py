"""``pass_through_block_bytes``: the ``target_max_block_size`` at which Ray passes a read task's blocks on
as the task yields them.

Ray Data's read operator buffers what a read task yields until the buffer holds more than the
dataset's ``DataContext.target_max_block_size`` (128 MiB by default), then concatenates it into one
block, and slices a block of at least ``MAX_SAFE_BLOCK_SIZE_FACTOR`` (1.5) times the target. Under the
default, a task's ``rows_per_block`` blocks of frames are merged until 128 MiB: the first batch waits
for all of them, and every frame is copied once more in the task. A target a little below one of our
blocks' bytes makes each block leave the buffer on its own and unsliced. docs/benchmarks.md has the
numbers.
"""

from __future__ import annotations

# A target this share of a block's estimated bytes: below a full block's bytes (the estimate's
# allowance for numbers and strings per row is small beside any camera's frame), and far enough
# above two thirds of them that Ray's slicing rule (1.5x the target) leaves the block whole.
_SHARE_OF_BLOCK = 0.8


def pass_through_block_bytes(*, rows_per_block: int, bytes_per_row: int | None) -> int | None:
    """The ``target_max_block_size`` (bytes) that lets blocks of ``rows_per_block`` rows of about
    ``bytes_per_row`` bytes through Ray's read buffer one by one, or None when the row size is not
    known (a mixture, ``image_transforms``, a camera without a shape)."""
    if bytes_per_row is None:
        return None
    return max(1, int(rows_per_block * bytes_per_row * _SHARE_OF_BLOCK))
