"""A feature's declared dtype: what its column may be stored as, and what a sample holds for it.

LeRobot 0.6 reads the data files through ``datasets`` with features built from info.json, so every
stored column is first cast to its declared dtype (pyarrow's safe cast: a value the declared type
cannot hold fails the load), and then makes tensors of the Python values with ``torch.tensor``:
every float becomes float32, every integer int64, a bool a bool (``io_utils.hf_transform_to_torch``).
Shapes of two to five dimensions are ``datasets`` ``Array2D``..``Array5D`` extension columns, read
through their storage (nested lists). This module is that rule, in one place, for every path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def _row_label(row: int) -> str:
    return f"row {row}"


def _check_lengths(array: pa.Array, level: int, shape: tuple[int, ...], where: str,
                   row_label: Callable[[int], str]) -> None:
    """Every list of nesting ``level`` (0: the rows' own) holds what ``shape`` gives it: flattened and
    re-cut, a short row would take the next row's values, silently (LeRobot's cast refuses it). A list
    nested less deeply than ``shape`` holds the rest of its dimensions flat."""
    dims = [int(d) for d in shape] or [1]
    deeper = 0  # list levels inside this one
    inner = storage_type(array.type.value_type)
    while _is_list(inner):
        deeper, inner = deeper + 1, storage_type(inner.value_type)
    expected = dims[level] if deeper and level < len(dims) else int(np.prod(dims[level:]))
    if pa.types.is_fixed_size_list(array.type):
        if array.type.list_size == expected or not len(array):
            return
        first, found = 0, int(array.type.list_size)
    else:
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero(lengths != expected)
        if not len(wrong):
            return
        first, found = int(wrong[0]), int(lengths[wrong[0]])
    # The levels above were checked: each row holds the same number of lists at this level.
    row = first // int(np.prod(dims[:level])) if level else first
    noun = ("list" if deeper else "value") + ("" if found == 1 else "s")
    nested = f" in a list at nesting level {level + 1}" if level else ""
    needs = f", which needs {expected} there" if level or len(dims) > 1 else ""
    raise DatasetFormatError(
        f"{where}: {row_label(row)} holds {found} {noun}{nested}, but info.json declares shape {list(shape)}{needs}. "
        f"LeRobot refuses this column too; fix the shape in info.json (or the column).")


def sample_values(column: pa.ChunkedArray | pa.Array, dtype: str, shape: tuple[int, ...], where: str, *,
                  as_sample: bool = True, row_label: Callable[[int], str] = _row_label) -> np.ndarray:
    """A numeric column's rows as a sample holds them: (rows, *shape) in ``sample_dtype(dtype)``, cast
    through the declared ``dtype`` first as LeRobot's load casts it (a float64 column declared float16
    rounds to float16). A cast that would lose values (an integer out of the declared range, a
    fraction declared an integer) is refused, naming both types, and so are a scalar column declared
    a shape of more than one value and a row whose list lengths are not the declared ``shape``'s
    (named by ``row_label(row)``). ``as_sample=False`` stops at the declared dtype (statistics are
    over the values as recorded, as LeRobot's writer computes them)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if array.null_count:
        raise DatasetFormatError(f"{where}: {array.null_count} null value(s)")
    rows = len(array)
    stored = array.type
    if not _is_list(stored) and int(np.prod(shape)) != 1:  # a scalar is legitimately declared [1] (or [])
        raise DatasetFormatError(
            f"{where}: stored as a scalar column ({stored}), but info.json declares shape {list(shape)}: samples "
            f"would hold one number where meta.features says {tuple(shape)}. Fix the shape in info.json ([1] for "
            f"a scalar) or store {int(np.prod(shape))} values per row as a list column.")
    level = 0
    while _is_list(array.type):
        _check_lengths(array, level, shape, where, row_label)
        level += 1
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
