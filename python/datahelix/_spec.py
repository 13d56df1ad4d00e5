"""ArraySpec: what a dataset that loads straight into shared memory declares for each array of
a sample (docs/datasets.md, "Your own Dataset": sample_spec and load_into)."""
from typing import Any, Sequence, Tuple


class ArraySpec:
    """An array a sample will have: its shape and dtype (a numpy dtype name: one of
    ``datahelix._collate.DTYPES``, the C table's dtypes that numpy has). ``sample_spec(i)``
    returns a dict with one of these for each array, the sample's other values (str, int,
    float, ...) as themselves; ``load_into(i, arrays)`` then fills
    ``arrays[name]`` (numpy views of the batch's shared-memory slab, of exactly that shape)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any) -> None:
        self.shape: Tuple[int, ...] = tuple(int(d) for d in shape)
        self.dtype = str(getattr(dtype, "name", dtype))

    def __repr__(self) -> str:
        return f"ArraySpec({self.shape}, {self.dtype!r})"

    def __reduce__(self) -> Any:
        return (ArraySpec, (self.shape, self.dtype))
