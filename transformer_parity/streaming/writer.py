"""Writing a streamed checkpoint: arrays into an open file from a worker thread, a band of rows at a time, around the
page cache where the file system allows (`O_DIRECT`), with the next tensors' sources read ahead.

A canonical safetensors file (`transformer_parity.io.safetensors_io`), a Keras `.weights.h5`
(`streaming.hdf5.write_deferred`) and a Hugging Face directory's shards all go through `BandWriter`.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from . import lazy

class BandWriter:
    """Writes arrays into the open binary file `f`, in the order given, from one worker thread: a `LazyArray` a band
    of rows at a time (`lazy.row_bands`: a transpose, a cast), a file's bytes as they are (`span`) read straight
    into the output's buffer or copied by the kernel, anything else whole; each as its C-order little-endian bytes.
    The next band is made (a transpose, which releases the GIL) while the worker hands the last one to the kernel. At
    most `depth` jobs wait, so memory stays a few bands. `wait()` before anything else touches `f`; an error in a
    write is raised there (a clean exit from the `with` block waits too, so nothing is left unwritten). A transpose
    is made into one of a few buffers that the worker hands back once their band is written (`spare`): a buffer
    allocated afresh for every band cost a page fault and a zeroed page per 4 KiB, as much time as the transpose.

    Where the file system takes O_DIRECT, the bytes go to the disk from a few page-aligned buffers and never enter
    the page cache (`DirectSink`, `DIRECT`). Elsewhere they are written through the page cache, and every `WRITEBACK`
    bytes the worker asks the kernel to start writing what it has written so far to the disk, and to drop from the
    page cache what an earlier request has written (`posix_fadvise(DONTNEED)`, a hint: a dirty page is never
    dropped). So the disk works while the conversion does, the caller's final fsync has little left, and a
    multi-GB output does not push its own source, or anything else, out of memory (docs/formats.md has the figures).
    The requests go from a third thread (`flusher`), at most two behind: starting writeback waits on the disk's queue
    (the block layer throttles background writes), which cost the worker a quarter of a 1 B conversion's time.

    `read_ahead(values)` names the values `put` will be given, in order: a second thread then reads the file bytes
    that those made rather than copied (a transpose, a cast) are made from, up to `AHEAD` bytes past the one being
    written, so a source on the disk arrives in the page cache at the disk's pace instead of a page fault at a time."""

    DIRECT = True  # write through `DirectSink` where the file system takes O_DIRECT (else the page cache, below)
    WRITEBACK = 64 << 20
    AHEAD = 256 << 20  # read ahead of the value being written, at most (one value's source, where it is larger)
    BAND = lazy.BAND_BYTES  # the most bytes a band made here holds (but one row, where a row is wider)

    def __init__(self, f, depth: int = 2):
        self.f, self.depth, self.pending = f, depth, []
        self.written: list[tuple[int, int]] = []  # byte ranges written since the last request, in order
        self.started: list[tuple[int, int]] = []  # ranges whose writeback the last request started
        self.since = 0
        self.buffers: list[np.ndarray] = []  # the band buffers this writer made (a few: see `_buffer`)
        self.spare: list[np.ndarray] = []  # those whose band is written: the worker appends, `_buffer` pops

    def __enter__(self) -> "BandWriter":
        from concurrent.futures import ThreadPoolExecutor

        self.sink, self.opened = None, not self.DIRECT  # the direct sink is opened by the first job (below)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="band-writer")
        self.flusher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="band-flusher")
        self.flushing: list = []  # the flusher's requests not yet known done (appended by the worker)
        self.reader, self.read_buffer = None, None
        self.upcoming: list = []  # (value, its source's span or None) for each value `put` will be given, in order
        self.next_put = self.next_read = 0  # the index `put` expects next; the first not yet handed to the reader
        return self

    def __exit__(self, kind, *exc) -> bool:
        try:
            if kind is None:
                self.wait()  # the direct sink's last partial block is written only when the run is settled
        finally:
            self.pool.shutdown(wait=True)
            self.flusher.shutdown(wait=True)
            if self.reader is not None:
                self.reader.shutdown(wait=True, cancel_futures=True)
            if self.sink is not None:
                self.sink.close()
        return False

    def seek(self, offset: int) -> None:
        """Write what follows at `offset` (after everything submitted before)."""
        self._submit(self._seek, offset)

    def put(self, value) -> int:
        """Queue `value`'s bytes at the current position; returns their count."""
        if self.next_put < len(self.upcoming) and self.upcoming[self.next_put][0] is value:
            self.next_put += 1
            self._read_on()
        span = getattr(value, "span", None)
        if span is not None:
            self._submit(self._copy, span)
            return span[2]
        bands = lazy.row_bands(value, self.BAND, out=self._buffer) if lazy.is_lazy(value) else [(0, 0, value)]
        nbytes = 0
        for _, _, band in bands:
            band = np.asarray(band)
            if band.dtype.name == "bfloat16":  # no byte order of its own: its bits as little-endian uint16
                band = band.view(np.uint16)
            band = np.ascontiguousarray(band, dtype=band.dtype.newbyteorder("<"))
            owner = next((b for b in self.buffers if band.base is b), None)  # made into one of ours: reused after
            self._submit(self._write, band.data.cast("B") if band.size else b"", owner)
            nbytes += band.nbytes
        return nbytes

    def read_ahead(self, values) -> None:
        """The values `put` will be given, in this order: the file bytes each is made from (`lazy.file_span`)
        are read on a second thread, ahead of its `put`, unless the value is those bytes as they are (the kernel
        copies those, reading ahead itself)."""
        if not hasattr(os, "preadv"):
            return
        self.upcoming = [(v, None if getattr(v, "span", None) is not None else lazy.file_span(v)) for v in values]
        self.next_put = self.next_read = 0
        self._read_on()

    def _read_on(self) -> None:
        """Hand the reader the spans after the last handed, while those past the value being written (the one `put`
        was last given) come to at most `AHEAD` bytes, or are the next one."""
        from concurrent.futures import ThreadPoolExecutor

        ahead = sum(span[2] for _, span in self.upcoming[self.next_put:self.next_read] if span is not None)
        while self.next_read < len(self.upcoming):
            span = self.upcoming[self.next_read][1]
            if span is not None:
                if ahead and ahead + span[2] > self.AHEAD:
                    return
                if self.reader is None:
                    self.reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="band-reader")
                    self.read_buffer = bytearray(8 << 20)  # one for every read (a zeroed page per 4 KiB, once)
                self.reader.submit(read_through, span, buffer=self.read_buffer)
                ahead += span[2]
            self.next_read += 1

    def wait(self) -> None:
        """Everything submitted is in the file (and `f` positioned after it)."""
        while self.pending:
            self.pending.pop(0).result()
        while self.flushing:  # the worker is idle now: nothing is appended meanwhile
            self.flushing.pop(0).result()
        if self.sink is not None:  # the worker is idle: this thread may touch the sink
            self.sink.settle()

    def _buffer(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """An array of `shape` and `dtype` for a band to be made into: a spare buffer whose band is written, or a
        new one. Each band waits for the writer before the next is made (`depth`), so a few buffers are ever made."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        buffer = self.spare.pop() if self.spare else None  # list.pop and append are atomic: the worker appends
        if buffer is None or buffer.nbytes < nbytes:
            if buffer is not None:
                self.buffers = [b for b in self.buffers if b is not buffer]  # too small for this band (a row
                # wider than BAND): let it go
            buffer = np.empty(max(nbytes, self.BAND), np.uint8)
            self.buffers.append(buffer)
        return buffer[:nbytes].view(dtype).reshape(shape)

    def _submit(self, job, *args) -> None:
        while len(self.pending) >= self.depth:
            self.pending.pop(0).result()
        self.pending.append(self.pool.submit(job, *args))

    # --- on the worker thread ---

    def _direct(self) -> "DirectSink | None":
        """The direct sink, opened at the first job: by then the caller has written through `f` what comes before
        (a header), and the sink starts where `f` stands."""
        if not self.opened:
            self.opened, self.sink = True, DirectSink.open(self.f)
        return self.sink

    def _seek(self, offset: int) -> None:
        if self._direct() is not None:
            self.sink.seek(offset)
        else:
            self.f.seek(offset)

    def _write(self, data, owner: np.ndarray | None = None) -> None:
        if self._direct() is not None:
            self.sink.write(data)
        else:
            start = self.f.tell()
            self.f.write(data)
            self._wrote(start, len(data))
        if owner is not None:
            self.spare.append(owner)

    def _copy(self, span: tuple[str, int, int]) -> None:
        """`span` read into the direct sink's buffers; or, through the page cache, copied by the kernel `WRITEBACK`
        bytes at a time, each followed by its writeback request (a 525 MB embedding copied in one piece took new
        page-cache pages for all of it: on a virtual machine that hands freed memory back to its host, 0.7 s where
        pages reused from the requests before took 0.26 s)."""
        if self._direct() is not None:
            self.sink.copy(span)
            return
        file, offset, nbytes = span
        for part in range(0, nbytes, self.WRITEBACK):
            size = min(self.WRITEBACK, nbytes - part)
            start = self.f.tell()  # copy_span flushes first, so this is the file's own position
            copy_span((file, offset + part, size), self.f)
            self._wrote(start, size)

    def _wrote(self, start: int, nbytes: int) -> None:
        if nbytes == 0 or not hasattr(os, "posix_fadvise"):
            return
        self.written.append((start, nbytes))
        self.since += nbytes
        if self.since < self.WRITEBACK:
            return
        self.f.flush()  # what Python still buffers reaches the kernel, and the request covers it
        while len(self.flushing) >= 2:
            self.flushing.pop(0).result()
        # drops the first (written back by now), starts the second
        self.flushing.append(self.flusher.submit(_advise, self.f.fileno(), self.started + self.written))
        self.started, self.written, self.since = self.written, [], 0


class DirectSink:
    """A stream of bytes written at file offsets with O_DIRECT: the disk reads them from page-aligned staging
    buffers, so they never pass through the page cache. Measured on a 1 B conversion (docs/formats.md): the system
    time fell from 1.5-1.9 s to 0.4-0.5 s and the wall time by about a sixth, to the disk's own write speed; writing
    through the page cache had cost a copy into fresh pages per byte, writeback work in the process, and, on a
    virtual machine that hands freed memory back to its host, pages the host had to supply again.

    O_DIRECT moves whole aligned blocks only, so a run of bytes that starts or ends inside a block first reads that
    block's other bytes from the file (what the caller wrote through `f` before, a HDF5 file's own structures) and
    writes them back with it; a last block that reaches past the end of the file is cut back (`ftruncate`) once the
    run is settled. A full staging buffer goes to the disk from a thread of its own while the next one fills
    (`STAGES` of them), so the disk is never idle for a copy. Every call comes from one thread (the band writer's
    worker). `open` gives None where the file system refuses O_DIRECT (tmpfs) or the system has none: the caller then
    writes through the page cache."""

    BLOCK = 4096  # a multiple of every disk's logical block size (512 or 4096)
    SIZE = 8 << 20  # a staging buffer: one O_DIRECT write, at most
    STAGES = 3

    @classmethod
    def open(cls, f) -> "DirectSink | None":
        if not hasattr(os, "O_DIRECT") or not os.path.isdir("/proc/self/fd"):
            return None
        try:
            fd = os.open(f"/proc/self/fd/{f.fileno()}", os.O_WRONLY | os.O_DIRECT)
        except (OSError, AttributeError, ValueError):
            return None
        try:  # the partial blocks' own bytes are read back through the page cache (`f` may be write-only)
            readable = os.open(f"/proc/self/fd/{f.fileno()}", os.O_RDONLY)
        except OSError:
            os.close(fd)
            return None
        return cls(f, fd, readable)

    def __init__(self, f, fd: int, readable: int):
        import mmap
        from concurrent.futures import ThreadPoolExecutor

        f.flush()  # what the caller wrote through `f` is in the file: a first partial block reads it back
        self.f, self.fd, self.readable, self.direct = f, fd, readable, True
        self.stages = [mmap.mmap(-1, self.SIZE) for _ in range(self.STAGES)]  # anonymous: page-aligned
        self.views = [memoryview(stage) for stage in self.stages]
        self.writing: list = [None] * self.STAGES  # each stage's write in flight
        self.current, self.view = 0, self.views[0]
        self.disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct-writer")
        self.size = os.fstat(f.fileno()).st_size  # the file's true size: the end of the furthest byte written
        self._start(f.tell())

    def _start(self, position: int) -> None:
        """A run at `position`: the staging buffer holds the block it starts in, up to it."""
        self.base, self.fill = position - position % self.BLOCK, position % self.BLOCK
        self.began = (self.base, self.fill)  # where the run's own bytes start: none written while it is here
        self._read_back(0, self.fill)

    def _read_back(self, lo: int, hi: int) -> None:
        """The file's own bytes at `base + lo` to `base + hi` into the staging buffer (zeros past its end)."""
        if hi <= lo:
            return
        self._drain()  # a write in flight may be to this block (the run before, ending in it)
        n = os.preadv(self.readable, [self.view[lo:hi]], self.base + lo)
        if n < hi - lo:
            self.view[lo + n:hi] = bytes(hi - lo - n)

    def write(self, data) -> None:
        data = memoryview(data).cast("B")
        done = 0
        while done < len(data):
            n = min(self.SIZE - self.fill, len(data) - done)
            self.view[self.fill:self.fill + n] = data[done:done + n]
            self.fill, done = self.fill + n, done + n
            if self.fill == self.SIZE:
                self._flush_full()

    def copy(self, span: tuple[str, int, int]) -> None:
        """`nbytes` of `file` from `offset`, read straight into the staging buffer."""
        file, offset, nbytes = span
        with open(file, "rb") as source:
            done = 0
            while done < nbytes:
                n = os.preadv(source.fileno(), [self.view[self.fill:self.fill + min(self.SIZE - self.fill,
                                                                                     nbytes - done)]], offset + done)
                if n == 0:
                    raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
                self.fill, done = self.fill + n, done + n
                if self.fill == self.SIZE:
                    self._flush_full()

    def seek(self, position: int) -> None:
        if position == self.base + self.fill:  # where the run stands (datasets laid out back to back): go on
            return
        self._finish_run()
        self._start(position)

    def settle(self) -> None:
        """Everything written is in the file, the file is its true size, and `f` is positioned after the data."""
        end = self.base + self.fill
        self._finish_run()
        if os.fstat(self.fd).st_size > self.size:
            os.ftruncate(self.fd, self.size)
        self.f.seek(end)
        self._start(end)

    def close(self) -> None:
        self.disk.shutdown(wait=True)
        os.close(self.fd)
        os.close(self.readable)
        for view, stage in zip(self.views, self.stages):
            try:
                view.release()
                stage.close()
            except BufferError:  # a slice still held by an error's traceback: the buffer goes with it, later
                pass

    def _flush_full(self) -> None:
        """The full staging buffer handed to the disk's thread; the next one (its own write done) fills."""
        self.writing[self.current] = self.disk.submit(self._pwrite_all, self.view[:self.SIZE], self.base)
        self.size = max(self.size, self.base + self.SIZE)
        self.current = (self.current + 1) % self.STAGES
        self.view = self.views[self.current]
        if self.writing[self.current] is not None:
            self.writing[self.current].result()
            self.writing[self.current] = None
        self.base, self.fill = self.base + self.SIZE, 0

    def _drain(self) -> None:
        for k, future in enumerate(self.writing):
            if future is not None:
                future.result()
                self.writing[k] = None

    def _finish_run(self) -> None:
        """The run's last, partial block written with the file's own bytes after it (none if the run wrote nothing)."""
        if (self.base, self.fill) == self.began:
            return
        if self.fill % self.BLOCK == 0:
            if self.fill:
                self._pwrite(self.fill)
            return
        length = self.fill + (-self.fill % self.BLOCK)
        self._read_back(self.fill, length)
        self._pwrite(length)

    def _pwrite(self, length: int) -> None:
        self._drain()
        self._pwrite_all(self.view[:length], self.base)
        self.size = max(self.size, self.base + self.fill)

    def _pwrite_all(self, data: memoryview, offset: int) -> None:
        done = 0
        while done < len(data):
            try:
                done += os.pwritev(self.fd, [data[done:]], offset + done)
            except OSError as exc:  # a file system that opened O_DIRECT but wants other alignments: the page cache
                if exc.errno != errno.EINVAL or not self.direct:
                    raise
                os.close(self.fd)
                self.fd, self.direct = os.dup(self.f.fileno()), False  # on through the page cache: any alignment


def _advise(fd: int, ranges: list[tuple[int, int]]) -> None:
    """`posix_fadvise(DONTNEED)` on each byte range of `fd`: writeback started for a dirty page, a clean one dropped."""
    for offset, length in ranges:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def read_through(span: tuple[str, int, int], chunk: int = 8 << 20, buffer: bytearray | None = None) -> None:
    """Read `nbytes` of `file` from `offset` into one reused buffer (`buffer`, which the caller may keep for its
    next call, else one made here), `chunk` bytes at a time, for the page cache's sake (the values are dropped),
    skipping each chunk whose first and last bytes the page cache already holds (a read that may not wait,
    `RWF_NOWAIT`, succeeds): copying a cached source for nothing cost 0.4 to 1 s of a 1 B conversion.
    `posix_fadvise(WILLNEED)` would not do: on Linux it starts a few MiB of reading per call, and measured no faster.
    A hint like those: a file that is gone, short or unreadable is for the conversion's own read to report, in its
    own words, so this one stops quietly."""
    file, offset, nbytes = span
    buffer = memoryview(bytearray(min(chunk, max(nbytes, 1))) if buffer is None else buffer)[:chunk]
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError:
        return
    try:
        for start in range(offset, offset + nbytes, len(buffer)):
            size = min(len(buffer), offset + nbytes - start)
            if _cached(fd, start) and _cached(fd, start + size - 1):
                continue
            if os.preadv(fd, [buffer[:size]], start) == 0:
                return
    except OSError:
        return
    finally:
        os.close(fd)


def _cached(fd: int, position: int) -> bool:
    """Whether the page cache holds the byte of `fd` at `position` (False where the system cannot tell)."""
    try:
        return os.preadv(fd, [bytearray(1)], position, os.RWF_NOWAIT) == 1
    except (OSError, AttributeError):  # EAGAIN: not cached; no RWF_NOWAIT here
        return False


def copy_span(span: tuple[str, int, int], out) -> None:
    """Write `nbytes` bytes of `file` from `offset` at `out`'s position (copy_file_range where the system has it, else
    64 MiB reads), leaving `out` positioned after them."""
    file, offset, nbytes = span
    out.flush()
    start = out.tell()
    with open(file, "rb") as f:
        done = 0
        if hasattr(os, "copy_file_range"):
            try:
                while done < nbytes:
                    n = os.copy_file_range(f.fileno(), out.fileno(), nbytes - done, offset + done)
                    if n == 0:
                        raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
                    done += n
            except OSError:  # a file system without it: the rest by reads
                pass
        out.seek(start + done)
        f.seek(offset + done)
        while done < nbytes:
            chunk = f.read(min(1 << 26, nbytes - done))
            if not chunk:
                raise ValueError(f"{file} ended inside a tensor (truncated while being read?)")
            out.write(chunk)
            done += len(chunk)
