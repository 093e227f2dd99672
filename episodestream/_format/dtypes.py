"""A feature's declared dtype: what its column may be stored as, and what a sample holds for it.

LeRobot 0.6 reads the data files through ``datasets`` with features built from info.json, so every
stored column is first cast to its declared dtype (pyarrow's safe cast: a value the declared type
cannot hold fails the load), and then makes tensors of the Python values with ``torch.tensor``:
every float becomes float32, every integer int64, a bool a bool (``io_utils.hf_transform_to_torch``).
Shapes of two to five dimensions are ``datasets`` ``Array2D``..``Array5D`` extension columns, read
through their storage (nested lists). This module is that rule, in one place, for every path.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from episodestream._base.errors import DatasetFormatError

# The numeric dtypes a LeRobot info.json may declare, as LeRobot's writer accepts them (numpy names).
NUMERIC_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                  "float16", "float32", "float64")
# The other dtypes read here: cameras, strings, and LeRobot 0.6's language annotations.
OTHER_DTYPES = ("video", "image", "string", "language")
READABLE_DTYPES = NUMERIC_DTYPES + OTHER_DTYPES


def is_numeric(dtype: str) -> bool:
    return dtype in NUMERIC_DTYPES


def sample_dtype(dtype: str) -> np.dtype:
    """The numpy dtype a sample holds for a numeric feature declared ``dtype``: float32 for every float,
    int64 for every integer, bool for bool (``torch.tensor`` of LeRobot's Python values)."""
    kind = np.dtype(dtype).kind
    return np.dtype(np.float32 if kind == "f" else np.int64 if kind in "iu" else np.bool_)


def not_supported(key: str, dtype: str, where: str) -> DatasetFormatError:
    """The error for a feature whose declared dtype this reader does not read (never called damaged)."""
    return DatasetFormatError(
        f"{where}: feature {key!r} has dtype {dtype!r}, which episodestream does not support (it reads "
        f"{', '.join(READABLE_DTYPES)}). Leave the feature out of the dataset's info.json 'features' to read "
        f"the rest, or open an issue with the dataset's info.json.")


def _is_list(arrow_type: pa.DataType) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type) or pa.types.is_large_list(arrow_type)


def storage_type(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` without its extension wrapper (``datasets``' ArrayND columns are nested lists)."""
    return arrow_type.storage_type if isinstance(arrow_type, pa.ExtensionType) else arrow_type


def value_type(arrow_type: pa.DataType) -> pa.DataType:
    """The type of the numbers inside ``arrow_type`` (through lists and an extension wrapper)."""
    arrow_type = storage_type(arrow_type)
    while _is_list(arrow_type):
        arrow_type = storage_type(arrow_type.value_type)
    return arrow_type


def stores_numbers(arrow_type: pa.DataType) -> bool:
    found = value_type(arrow_type)
    return pa.types.is_integer(found) or pa.types.is_floating(found) or pa.types.is_boolean(found)


def sample_values(column: pa.ChunkedArray | pa.Array, dtype: str, shape: tuple[int, ...], where: str, *,
                  as_sample: bool = True) -> np.ndarray:
    """A numeric column's rows as a sample holds them: (rows, *shape) in ``sample_dtype(dtype)``, cast
    through the declared ``dtype`` first as LeRobot's load casts it (a float64 column declared float16
    rounds to float16). A cast that would lose values (an integer out of the declared range, a
    fraction declared an integer) is refused, naming both types. ``as_sample=False`` stops at the
    declared dtype (statistics are over the values as recorded, as LeRobot's writer computes them)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if array.null_count:
        raise DatasetFormatError(f"{where}: {array.null_count} null value(s)")
    rows = len(array)
    stored = array.type
    while _is_list(array.type):
        array = array.flatten()
        if isinstance(array, pa.ExtensionArray):
            array = array.storage
    if array.null_count:
        raise DatasetFormatError(f"{where}: {array.null_count} null value(s)")
    declared = pa.from_numpy_dtype(np.dtype(dtype))
    if array.type != declared:
        try:
            array = array.cast(declared, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise DatasetFormatError(
                f"{where}: stored as {value_type(stored)}, declared {dtype!r} in info.json, and its values do not "
                f"fit the declared type ({error}). LeRobot refuses this column too; fix the dtype in info.json "
                f"(or the column).") from None
    flat = array.to_numpy(zero_copy_only=False)
    want = sample_dtype(dtype) if as_sample else flat.dtype
    if flat.dtype.kind == "u" and want.kind == "i" and flat.size and flat.max() > np.iinfo(np.int64).max:
        raise DatasetFormatError(f"{where}: declared {dtype!r}, holds {flat.max()}, beyond int64, which samples "
                                 f"hold integers as (as LeRobot's torch.tensor does)")
    flat = flat.astype(want, copy=False)
    if not _is_list(stored) and not _is_list(storage_type(stored)):
        return flat
    if flat.size != rows * int(np.prod(shape)):
        raise DatasetFormatError(f"{where}: {flat.size} values for {rows} rows do not fit the declared "
                                 f"shape {list(shape)}")
    return flat.reshape((rows, *shape))
