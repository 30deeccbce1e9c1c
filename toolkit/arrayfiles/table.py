"""Numeric CSV tables, read a range of rows at a time."""
from __future__ import annotations

import csv

import numpy as np

from ..errors import UserError
from .files import Where, check_file, check_fits
from .rows import Rows

# rows parsed at a time by a whole read: Python's lists of floats take some 20 times the memory
# of the array they become
_BLOCK_ROWS = 1 << 14


def _is_numbers(cells: list[str]) -> bool:
    try:
        [float(x) for x in cells]
    except ValueError:
        return False
    return True


class CsvRows(Rows):
    """A numeric CSV's rows as [rows, columns] of ``dtype``; a first row that is not all numbers
    is its ``header`` (else None). Blank lines are skipped. One pass at opening counts the rows
    and checks the columns; ``read`` then goes through the file in order (a read that does not
    start where the last ended starts the file again)."""

    def __init__(self, path: str, dtype=np.float32):
        check_file(path)                    # a FIFO would hang the scan, a device never end it
        self.where, self.dtype = Where(path, "CSV"), np.dtype(dtype)
        self.header, self.rows, self.columns = self._scan()
        self.row_shape = (self.columns,)
        self.file = self.lines = None
        self.pos = 0

    def _scan(self) -> tuple[list[str] | None, int, int]:
        """(header, rows, columns), checking that every row has as many columns as the first."""
        path = self.where.path
        header, first, rows = None, None, 0
        with self.where.reading(), open(path, newline="") as f:
            reader = csv.reader(f)
            for cells in reader:
                if not cells:
                    continue
                if first is None:
                    first = cells
                    if not _is_numbers(cells):
                        header = cells
                        continue
                elif len(cells) != len(first):
                    raise UserError(f"{path}: the CSV rows have different numbers of columns (line {reader.line_num} "
                                    f"has {len(cells)}, the {'header' if header else 'first row'} has {len(first)})")
                rows += 1
        if first is None:
            raise UserError(f"{path}: the CSV file is empty")
        if not rows:
            raise UserError(f"{path}: the CSV file has a header but no data rows")
        return header, rows, len(first)

    def _restart(self) -> None:
        self.close()
        self.file = open(self.where.path, newline="")
        reader = csv.reader(self.file)
        self.lines = ((reader.line_num, cells) for cells in reader if cells)
        if self.header:
            next(self.lines, None)
        self.pos = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        with self.where.reading():
            if self.lines is None or start < self.pos:
                self._restart()
            for _ in range(start - self.pos):
                next(self.lines, None)
            rows = [next(self.lines, None) for _ in range(stop - start)]
        self.pos = stop
        if None in rows or any(len(cells) != self.columns for _, cells in rows):
            raise self.where.unreadable("it changed while being read")
        return self._numbers(rows)

    def read_all(self) -> np.ndarray:
        """Every row, a block at a time into one array (parsed text held for one block only),
        after checking the machine can hold the array."""
        check_fits(self.where, (self.rows, self.columns), self.dtype, self.rows * self.columns * self.dtype.itemsize)
        out = np.empty((self.rows, self.columns), self.dtype)
        for start in range(0, self.rows, _BLOCK_ROWS):
            stop = min(start + _BLOCK_ROWS, self.rows)
            out[start:stop] = self.read(start, stop)
        return out

    def _numbers(self, rows: list[tuple[int, list[str]]]) -> np.ndarray:
        values = []
        for line, cells in rows:
            try:
                values.append([float(x) for x in cells])
            except ValueError as e:
                raise UserError(f"{self.where.path}: non-numeric value in the CSV (line {line}: {e})") from None
        return np.array(values, self.dtype).reshape(len(rows), self.columns)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = self.lines = None
