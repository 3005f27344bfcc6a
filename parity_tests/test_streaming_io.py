"""The streaming room (`transformer_parity.streaming`): the compiled transpose moves every bit on every path this CPU
has, the band writer writes every byte (through the page cache or around it, with writeback asked for and sources
read ahead), and a file system that refuses direct writes is written through the page cache instead."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_parity.streaming import lazy as lz
from transformer_parity.streaming import transpose
from transformer_parity.streaming import writer as rio


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(f"u{array.dtype.itemsize}")


def test_the_compiled_transpose_is_built():
    """The package's one C file is optional to install, but a build that silently failed would leave every
    conversion on the 3x slower NumPy path: where it is expected (CI builds it), it must be there."""
    import os

    if os.environ.get("TRANSFORMER_PARITY_NO_C"):
        pytest.skip("TRANSFORMER_PARITY_NO_C is set: the NumPy path is asked for")
    assert transpose._tiles is not None, (
        "transformer_parity.streaming._transpose was not built: pip install -e . with a C compiler, or TRANSFORMER_PARITY_NO_C=1")


@pytest.mark.parametrize("path", ["compiled", "numpy"])
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 700), cols=st.integers(1, 700), dtype=st.sampled_from(["u1", "bfloat16", "f4", "f8"]),
       cut=st.sampled_from(["whole", "columns", "rows"]), seed=st.integers(0, 2**31 - 1))
def test_transposed_moves_every_bit(path, rows, cols, dtype, cut, seed):
    """Bit for bit against NumPy's own `.T` copy, through the compiled tiles and through the NumPy blocks that stand
    in without them, at every item size, for odd sizes that leave partial tiles, for a column slice of a wider matrix
    (what a band of a transpose reads) and a row slice; NaN payloads and signed zeros are bits like any other."""
    import ml_dtypes

    if path == "compiled" and transpose._tiles is None:
        pytest.skip("transformer_parity.streaming._transpose is not built")

    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** (8 * dtype.itemsize), (rows + 3, cols + 5), dtype=f"u{dtype.itemsize}")
    whole = bits.view(dtype)
    source = {"whole": whole, "columns": whole[:rows, 2:cols + 2],
              "rows": whole[3:, :cols]}[cut]
    tiles = transpose._tiles
    transpose._tiles = tiles if path == "compiled" else None
    try:
        out = transpose.transposed(source)
    finally:
        transpose._tiles = tiles
    assert out.dtype == dtype and out.shape == source.shape[::-1] and out.flags.c_contiguous
    assert not np.shares_memory(out, whole)
    expected = _bits(np.array(source.T, order="C"))
    np.testing.assert_array_equal(_bits(out), expected)
    if path == "compiled":  # the tiles themselves, also below the size `transposed` hands them, at every level
        for level in range(tiles.LEVEL + 1):  # of vector instructions this CPU has (the blocks, and item by item)
            direct = np.empty_like(expected)
            tiles.transpose(_bits(source), direct, level)
            np.testing.assert_array_equal(direct, expected, err_msg=f"level {level}")


def test_the_compiled_transpose_refuses_what_it_cannot_do():
    tiles = transpose._tiles
    if tiles is None:
        pytest.skip("transformer_parity.streaming._transpose is not built")
    a = np.zeros((4, 6), np.uint16)
    with pytest.raises(ValueError, match="2-D arrays expected, got 3-D and 2-D"):
        tiles.transpose(np.zeros((2, 2, 2), np.uint16), np.zeros((2, 4), np.uint16))
    with pytest.raises(ValueError, match=r"a \(4, 6\) destination for a \(4, 6\) source"):
        tiles.transpose(a, np.zeros((4, 6), np.uint16))
    with pytest.raises(ValueError, match="item sizes 2 and 4"):
        tiles.transpose(a, np.zeros((6, 4), np.uint32))
    with pytest.raises(ValueError, match="each row's items must be contiguous"):
        tiles.transpose(np.zeros((4, 12), np.uint16)[:, ::2], np.zeros((6, 4), np.uint16))
    read_only = np.zeros((6, 4), np.uint16)
    read_only.setflags(write=False)
    with pytest.raises((ValueError, BufferError), match="read-only|not writable"):
        tiles.transpose(a, read_only)
    with pytest.raises(ValueError, match=rf"level {tiles.LEVEL + 1} asked for; this CPU has levels 0 to {tiles.LEVEL}"):
        tiles.transpose(a, np.zeros((6, 4), np.uint16), tiles.LEVEL + 1)


def test_the_compiled_transpose_uses_the_widest_vectors_the_cpu_has():
    """The level picked at import is the best this CPU offers: a build that fell back to item-by-item copies (or
    to SSE2 on a machine with AVX2) would pass every bit-for-bit test and run several times slower."""
    tiles = transpose._tiles
    if tiles is None:
        pytest.skip("transformer_parity.streaming._transpose is not built")
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert tiles.LEVEL == 0 and tiles.ISA == "portable"
        return
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if not flags:
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    expected = 3 if {"avx512f", "avx512bw"} <= set(flags) else 2 if "avx2" in flags else 1
    assert (tiles.LEVEL, tiles.ISA) == (expected, ("portable", "sse2", "avx2", "avx512")[expected])


def test_the_band_writer_asks_for_writeback_and_writes_every_byte(tmp_path, monkeypatch):
    """Every `WRITEBACK` bytes the writer hints the kernel (`posix_fadvise(DONTNEED)`) to write out what it has
    written and drop what an earlier hint wrote; the hint never changes the file: written bands, a transposed lazy
    tensor and a file span copied by the kernel read back exactly, at the offsets a seek put them."""
    import os

    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this system")

    monkeypatch.setattr(rio.BandWriter, "DIRECT", False)  # the page-cache path, where a file system refuses O_DIRECT
    hints: list[tuple[int, int]] = []
    real = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, offset, length, advice: (
        hints.append((offset, length)), real(fd, offset, length, advice))[1])
    monkeypatch.setattr(rio.BandWriter, "WRITEBACK", 1 << 14)
    rng = np.random.default_rng(0)
    plain = rng.integers(0, 256, 50_000, dtype=np.uint8)
    matrix = rng.integers(0, 2**16, (300, 250), dtype=np.uint16)
    source = tmp_path / "source.bin"
    source.write_bytes(matrix.tobytes())
    lazy = lz.LazyArray((250, 300), np.uint16, lambda: matrix.T.copy(),
                             bands=lz._transposed_bands(lz.LazyArray(matrix.shape, np.uint16,
                                                                               lambda: matrix.copy())))
    span = lz.LazyArray(matrix.shape, np.uint16, lambda: matrix.copy(), span=(str(source), 0, matrix.nbytes))
    with open(tmp_path / "out.bin", "wb") as f, rio.BandWriter(f) as writer:
        writer.put(plain)
        writer.put(lazy)
        writer.seek(300_000)
        writer.put(span)
        writer.wait()
    data = (tmp_path / "out.bin").read_bytes()
    assert data[:plain.nbytes] == plain.tobytes()
    assert data[plain.nbytes:plain.nbytes + matrix.nbytes] == matrix.T.tobytes()
    assert data[300_000:] == matrix.tobytes()
    assert hints, "no writeback was asked for"
    covered = sorted(hints)
    assert covered[0][0] == 0 and all(length > 0 for _, length in covered)
    assert max(offset + length for offset, length in covered) <= len(data)
    assert all(hints.count(h) <= 2 for h in hints)  # each range hinted once to write, once more to drop


@pytest.mark.parametrize("direct", [False, True])
def test_the_band_writer_makes_transposes_into_a_few_reused_buffers(tmp_path, monkeypatch, direct):
    """A transpose's bands are made into buffers the writer hands back once written: a tensor of 60 bands goes
    through at most `depth` + 2 of them, and no band is overwritten before it is written, even with a writer slower
    than the transposes (every byte reads back exactly, also for a second tensor that reuses the first's buffers, and
    a band wider than the buffers gets a buffer of its own)."""
    import time


    class Slow:
        """The output file, slower than the transposes: a band handed back too early is overwritten meanwhile."""
        def __init__(self, f):
            self.f = f

        def write(self, data):
            time.sleep(0.002)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(rio.BandWriter, "BAND", 4096)
    monkeypatch.setattr(rio.BandWriter, "DIRECT", direct)
    rng = np.random.default_rng(1)
    matrices = [rng.integers(0, 2**16, (64, 120 * 16), dtype=np.uint16), rng.integers(0, 2**16, (40, 77), np.uint16),
                rng.integers(0, 2**16, (3000, 50), dtype=np.uint16)]  # the last: one row of its transpose > 4096 bytes

    def lazy(m):
        return lz.LazyArray(m.shape[::-1], m.dtype, lambda: m.T.copy(),
                                 bands=lz._transposed_bands(lz.LazyArray(m.shape, m.dtype, lambda: m.copy())))

    with open(tmp_path / "out.bin", "wb") as f, rio.BandWriter(Slow(f)) as writer:
        for m in matrices:
            writer.put(lazy(m))
        writer.wait()
        made = len(writer.buffers)
    assert (tmp_path / "out.bin").read_bytes() == b"".join(m.T.tobytes() for m in matrices)
    assert 1 <= made <= writer.depth + 2, f"{made} band buffers made for three tensors of 60, 2 and 50 bands"


def test_the_band_writer_reads_sources_ahead_within_its_window(tmp_path, monkeypatch):
    """`read_ahead(values)` hands the reader each made value's source span once, in order, and never more than
    `AHEAD` bytes past the value being written (a single span larger than that alone); a value copied as stored
    (a `span` of its own) is the kernel's to read and is not handed over; every byte is still written exactly."""

    matrix = np.random.default_rng(2).integers(0, 2**16, (100, 100), dtype=np.uint16)  # 20,000 bytes
    source = tmp_path / "source.bin"
    source.write_bytes(matrix.tobytes() * 10)

    def stored(k):
        return lz.LazyArray(matrix.shape, np.uint16, lambda: matrix.copy(),
                                 span=(str(source), k * matrix.nbytes, matrix.nbytes))

    values = [lz.LazyArray((100, 100), np.uint16, lambda: matrix.T.copy(),
                                bands=lz._transposed_bands(stored(k)), source=stored(k)) for k in range(9)]
    values.insert(4, stored(9))  # copied as it is: not read ahead
    handed: list[tuple[str, int, int]] = []
    monkeypatch.setattr(rio, "read_through", lambda span, **kw: handed.append(span))
    monkeypatch.setattr(rio.BandWriter, "AHEAD", 50_000)
    windows = []
    with open(tmp_path / "out.bin", "wb") as f, rio.BandWriter(f) as writer:
        writer.read_ahead(values)
        for value in values:
            windows.append(sum(s[2] for _, s in writer.upcoming[writer.next_put:writer.next_read] if s))
            writer.put(value)
        writer.wait()
    assert handed == [lz.file_span(v) for v in values if v.span is None]
    assert max(windows) <= 50_000 and windows[0] == 40_000  # two spans of 20,000 ahead, never a third
    expected = b"".join(matrix.tobytes() if v.span else matrix.T.tobytes() for v in values)
    assert (tmp_path / "out.bin").read_bytes() == expected


@settings(max_examples=40, deadline=None)
@given(existing=st.integers(0, 30_000), runs=st.lists(st.tuples(st.integers(0, 9_000), st.lists(
    st.tuples(st.sampled_from(["bytes", "copy"]), st.integers(0, 20_000)), min_size=1, max_size=4)),
    min_size=1, max_size=4), head=st.integers(0, 5_000), seed=st.integers(0, 2**31 - 1))
def test_direct_writes_leave_exactly_the_bytes_a_plain_write_would(tmp_path_factory, existing, runs, head, seed):
    """The O_DIRECT sink writes whole aligned blocks from a staging buffer smaller than some runs here, so every run
    that starts or ends inside a block must carry the file's own bytes around it: a header the caller wrote through
    the file object first, what lay in the file before (a HDF5 file's structures), the run before it. Against the
    same seeks, writes and file copies done plainly, the file is the same to the byte, and as long."""

    tmp = tmp_path_factory.mktemp("direct")
    rng = np.random.default_rng(seed)
    source = tmp / "source.bin"
    source.write_bytes(rng.integers(0, 256, 40_000, dtype=np.uint8).tobytes())
    before = rng.integers(0, 256, existing, dtype=np.uint8).tobytes()
    header = rng.integers(0, 256, head, dtype=np.uint8).tobytes()
    ops, position = [], head
    for gap, pieces in runs:  # ascending runs that never overlap, as the writers lay them out
        position += gap
        ops.append(("seek", position))
        for kind, n in pieces:
            if kind == "bytes":
                ops.append(("bytes", rng.integers(0, 256, n, dtype=np.uint8)))
            else:
                ops.append(("copy", (str(source), int(rng.integers(0, 40_000 - n + 1)), n)))
            position += n
    plain = tmp / "plain.bin"  # the judge: the same operations on a plain file object
    plain.write_bytes(before)
    with open(plain, "r+b") as f:
        f.write(header)
        for kind, arg in ops:
            if kind == "seek":
                f.seek(arg)
            else:
                f.write(arg.tobytes() if kind == "bytes" else source.read_bytes()[arg[1]:arg[1] + arg[2]])
    expected = plain.read_bytes()
    path = tmp / "out.bin"
    path.write_bytes(before)
    size = rio.DirectSink.SIZE
    rio.DirectSink.SIZE = 12_288  # three blocks: runs here cross the staging buffer's end
    try:
        with open(path, "r+b") as f, rio.BandWriter(f) as writer:
            f.write(header)
            for kind, arg in ops:
                if kind == "seek":
                    writer.seek(arg)
                elif kind == "bytes":
                    writer.put(arg)
                else:
                    writer.put(lz.LazyArray((arg[2],), np.uint8, lambda: None, span=arg))
            writer.wait()
            direct = writer.sink is not None
            f.flush()
    finally:
        rio.DirectSink.SIZE = size
    if not direct:
        pytest.skip("this file system refuses O_DIRECT: the page-cache path ran (tested above)")
    assert path.read_bytes() == expected


def test_a_direct_write_the_file_system_refuses_goes_on_through_the_page_cache(tmp_path, monkeypatch):
    """A file system may open a file with O_DIRECT and still refuse its writes (EINVAL: other alignments): the sink
    then writes the same blocks through the page cache, and the file is still exactly the bytes given."""
    import errno
    import os


    fcntl = pytest.importorskip("fcntl")

    real, refused = os.pwritev, []

    def picky(fd, buffers, offset, *flags):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, buffers, offset, *flags)

    monkeypatch.setattr(os, "pwritev", picky)
    data = np.random.default_rng(3).integers(0, 256, 3 * rio.DirectSink.SIZE + 1234, dtype=np.uint8)
    with open(tmp_path / "out.bin", "wb") as f, rio.BandWriter(f) as writer:
        f.write(b"header")
        writer.put(data)
        writer.wait()
        opened = writer.sink is not None
    if not opened:
        pytest.skip("this file system refuses O_DIRECT at open: the page-cache path ran")
    assert refused == [0]  # the first staging buffer refused once; never O_DIRECT again
    assert (tmp_path / "out.bin").read_bytes() == b"header" + data.tobytes()


def test_the_direct_writer_settles_on_a_clean_exit_and_goes_on_through_back_to_back_seeks(tmp_path, monkeypatch):
    """Leaving the `with` block without `wait()` still writes the last partial block (the direct sink holds it until
    the run is settled), and a seek to where the run stands (HDF5 datasets laid out back to back) neither writes nor
    reads a block: the run goes on."""

    reads = []
    real = rio.DirectSink._read_back
    monkeypatch.setattr(rio.DirectSink, "_read_back", lambda self, lo, hi: (reads.append((lo, hi)),
                                                                              real(self, lo, hi))[1])
    data = np.random.default_rng(4).integers(0, 256, 10_000, dtype=np.uint8)
    with open(tmp_path / "out.bin", "wb") as f, rio.BandWriter(f) as writer:
        f.write(b"head")
        writer.put(data[:3000])
        writer.seek(4 + 3000)
        writer.put(data[3000:])
        direct = writer.sink is not None
    if not direct:
        pytest.skip("this file system refuses O_DIRECT: the page-cache path ran")
    assert (tmp_path / "out.bin").read_bytes() == b"head" + data.tobytes()
    # the header's block read back at the start, the rest of the last block at the end, and that block's head again
    # where the settled run is ready to go on; nothing at the seek to where the run stood
    assert [r for r in reads if r[1] > r[0]] == [(0, 4), (10_004, 12_288), (0, 10_004 % 4096)]


def test_read_ahead_reads_what_the_page_cache_lacks_and_skips_what_it_holds(tmp_path, monkeypatch):
    """`read_through` (the band writer's read-ahead) reads a span in chunks, and skips a chunk the page cache already
    holds: a file just written and read is cached, so nothing is copied; where nothing is cached, every byte of the
    span is read once, in order, and not one byte past it."""
    import os

    if not hasattr(os, "preadv"):
        pytest.skip("no preadv on this system")

    path = tmp_path / "source.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    path.read_bytes()
    reads: list[tuple[int, int]] = []
    real = os.preadv

    def counting(fd, buffers, position, *flags):
        n = real(fd, buffers, position, *flags)
        if not flags:  # a read that fills the buffer, not a probe
            reads.append((position, n))
        return n

    monkeypatch.setattr(os, "preadv", counting)
    rio.read_through((str(path), 1000, 90_000), chunk=16_384)
    assert reads == [], "a cached span was copied"
    monkeypatch.setattr(rio, "_cached", lambda fd, position: False)
    rio.read_through((str(path), 1000, 90_000), chunk=16_384)
    assert [p for p, _ in reads] == list(range(1000, 91_000, 16_384))
    assert sum(n for _, n in reads) == 90_000
    rio.read_through((str(tmp_path / "gone.bin"), 0, 10))  # a hint: the conversion's own read reports a missing file
    rio.read_through((str(path), 99_000, 5_000))  # past the end: stops at the end, quietly
