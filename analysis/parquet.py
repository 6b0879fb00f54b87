"""Reading a Parquet file the commands were given, from its bytes, without leaving threads
behind.

``pyarrow.parquet.read_table`` (and ``pandas.read_parquet`` through it) reads through
pyarrow's dataset scanner, whose threads can still be alive when the interpreter exits: the
process then aborts in C++ (``terminate called without an active exception``, status -6) after
the command has said what it had to (apache/arrow#34314).  Measured here by
``bench/parquet_exit``: about 1 process in 40 on a loaded 2-CPU machine.  The plain file
reader, on the calling thread, leaves none.
"""
from __future__ import annotations

from typing import Any


def read_parquet_bytes(data: bytes) -> Any:
    """The ``pyarrow.Table`` in ``data``, read on this thread (pyarrow's errors propagate:
    they have no common base but Exception)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    return pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)


def parquet_frame(data: bytes) -> Any:
    """``read_parquet_bytes`` as a pandas DataFrame (converted on this thread too)."""
    return read_parquet_bytes(data).to_pandas(use_threads=False)
