"""Streaming: a checkpoint converted or verified a tensor, a band of rows, at a time, so that a multi-GB model is
never held whole.

- `lazy`: arrays not read yet (`LazyArray`), read a band of rows at a time, and the `defer` that lets the one
  mapping engine (`reference_numpy.mapping`) map them to more of them;
- `transpose`: the transpose a conversion spends its time on, copied in tiles by compiled code (`_transpose.c`,
  optional);
- `writer`: arrays written into a file from a worker thread, around the page cache (`O_DIRECT`) where the file
  system allows, with the next sources read ahead (`BandWriter`);
- `hdf5`: HDF5 datasets written a band at a time, read lazily, and a hostile file's layout checked first.
"""
