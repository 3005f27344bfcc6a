"""The streamed transpose alone: `transformer_parity.streaming.transpose.transposed` on the 1 B Llama shapes, band by band.

    python benchmarks/bench_transpose.py            # every level this CPU has, and the NumPy fallback
    python benchmarks/bench_transpose.py --rounds 9

A conversion transposes each Linear weight (out, in) -> (in, out) a band of at most 8 MiB at a time, reading the
source from the page cache and writing each band into one of a few reused buffers (`transformer_parity.streaming.writer.BandWriter`).
This times exactly that, in memory, for each vector level of the compiled tiles (`transformer_parity.streaming._transpose`:
0 item by item, 1 SSE2, 2 AVX2, 3 AVX-512) that this CPU has, and for NumPy's blocks (the path without a C
compiler), interleaved round by round; it prints GB/s of bfloat16 moved (the median round) and each path's ratio to
the NumPy blocks. A source 2 GB/s slower than another here is still bounded, in a conversion, by the writes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_numpy import mapping  # noqa: E402
from transformer_parity.streaming import lazy, transpose  # noqa: E402

# (out, in) of Llama-3.2-1B's Linear weights: q and o, k and v, gate and up, down
SHAPES = [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)]


def paths() -> dict:
    """name -> a function (source, out) that writes source.T into out, for every path this machine has."""
    tiles = transpose._tiles
    found = {}
    if tiles is not None:
        names = ("portable", "sse2", "avx2", "avx512")
        for level in range(tiles.LEVEL + 1):
            found[f"compiled, level {level} ({names[level]})"] = (
                lambda level: lambda source, out: tiles.transpose(source, out, level))(level)

    def blocks(source, out):  # reference_numpy.mapping.transposed: NumPy's blocks, as without the compiled tiles
        mapping.transposed(source, out)
    found["numpy blocks (no C compiler)"] = blocks
    return found


def one_round(fn, sources) -> float:
    """Seconds to transpose every source band by band into one reused buffer."""
    start = time.perf_counter()
    for source in sources:
        rows = max(1, lazy.BAND_BYTES // (source.shape[0] * source.itemsize))
        buffer = np.empty(rows * source.shape[0], source.dtype)
        for a in range(0, source.shape[1], rows):
            band = source[:, a:a + rows]
            fn(band, buffer[:band.size].reshape(band.shape[::-1]))
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per path (the median is printed)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    rng = np.random.default_rng(0)
    sources = [rng.integers(0, 2**16, shape, dtype=np.uint16) for shape in SHAPES]  # bfloat16's bits
    nbytes = sum(s.nbytes for s in sources)
    found = paths()
    for name, fn in found.items():  # every path moves the same bits
        out = np.empty(SHAPES[0][::-1], np.uint16)
        fn(sources[0], out)
        assert np.array_equal(out, sources[0].T), name
    times: dict[str, list[float]] = {name: [] for name in found}
    for _ in range(args.rounds):
        for name, fn in found.items():
            times[name].append(one_round(fn, sources))
    numpy_s = statistics.median(times["numpy blocks (no C compiler)"])
    print(f"{nbytes / 1e6:.0f} MB of bfloat16 per round (the 1 B shapes' q, k, gate, down), bands of at most "
          f"{lazy.BAND_BYTES >> 20} MiB, {args.rounds} rounds, median")
    print(f"{'path':40s} {'GB/s':>6s} {'x numpy':>8s}")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(f"{name:40s} {nbytes / median / 1e9:6.2f} {numpy_s / median:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
