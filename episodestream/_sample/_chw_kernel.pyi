# Types of the compiled module built from _chw_kernel.c (see there, and _chw.py for its use).
import numpy as np

def hwc_to_chw(src: np.ndarray, dst: np.ndarray, /) -> None: ...
