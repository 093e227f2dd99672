"""Pure planning, tabular-free and video-free: the epoch permutation and split, the pool schedule,
resume arithmetic and mixture planning. Imports only ``_base``; no torch, pyarrow or decoders."""
