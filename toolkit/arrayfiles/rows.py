"""Arrays read a range of rows at a time, and arrays already read whole."""
from __future__ import annotations

import numpy as np


class Rows:
    """The rows of one array from a file. ``rows`` is None for an array without a batch axis
    (0-d), which is read whole. ``row_shape`` and ``dtype`` are those of what ``read`` returns."""
    rows: int | None
    row_shape: tuple
    dtype: np.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def read_all(self) -> np.ndarray:
        return self.read(0, self.rows or 0)

    def close(self) -> None:
        pass


class WholeRows(Rows):
    """An array already in memory (a compressed .npz member, a 0-d or Fortran-ordered array)."""

    def __init__(self, arr: np.ndarray):
        self.arr = np.asarray(arr)
        self.rows = self.arr.shape[0] if self.arr.ndim else None
        self.row_shape, self.dtype = self.arr.shape[1:], self.arr.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.arr if self.rows is None else self.arr[start:stop]
