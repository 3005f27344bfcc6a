/* A cache-blocked 2-D transpose for transformer_parity.streaming.transpose.transposed: the one step of a checkpoint conversion that
 * does arithmetic on addresses rather than values (a Linear's (out, in) to the canonical (in, out)).
 *
 * The matrix is walked in tiles of 256 x 256 items (128 x 128 of 4-byte items) so that a tile's source rows and
 * destination rows stay in the core's cache, and each tile in blocks that are transposed in vector registers and
 * written straight to the destination: R source rows by C columns loaded, C destination rows of R items stored.
 * Each 128-bit lane of a register holds one 8 x 8 block of 2-byte items (4 x 4 of 4-byte items) and is transposed by
 * the same unpack network, so a wider register only stacks more source rows into one store:
 *
 *   level 1, SSE2       2-byte items: blocks of  8 rows x 8 columns, 16-byte stores; 4-byte:  4 x 4
 *   level 2, AVX2       2-byte items: blocks of 16 rows x 8 columns, 32-byte stores; 4-byte:  8 x 4
 *   level 3, AVX-512BW  2-byte items: blocks of 32 rows x 8 columns, 64-byte stores; 4-byte: 16 x 4
 *
 * At level 3 every store fills a whole 64-byte cache line. The best level the CPU has is picked at import (`LEVEL`);
 * `transpose(src, dst, level)` can ask for a lower one, which the tests use to check every level bit for bit on any
 * machine. Items of 1 or 8 bytes, the blocks' leftovers at a matrix's edges, and CPUs other than x86-64 go item by
 * item through the same tiles (level 0). Measured on the 1 B Llama shapes (docs/formats.md).
 *
 * Optional: the package builds and runs without it (mapping.transposed falls back to NumPy), and it imports nothing
 * but Python's C API. Only values are moved, bit for bit; the item size is all it knows of the dtype. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_SSE2 1
#define HAVE_WIDE 1 /* AVX2 and AVX-512 code compiled per function (target attributes), used where the CPU has them */
#elif defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_SSE2 1
#endif

#if defined(__GNUC__) || defined(__clang__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

/* Blocks over rows [i0, i1) and columns [j0, j1) of a tile (each a multiple of the block's rows and columns):
 * d[c * ds + r] = s[r * ss + c]; strides in bytes. */
typedef void (*blocks_fn)(const char *s, Py_ssize_t ss, char *d, Py_ssize_t ds, Py_ssize_t i0, Py_ssize_t i1,
                          Py_ssize_t j0, Py_ssize_t j1);
typedef struct {
    blocks_fn fn;
    Py_ssize_t rows, cols;
} kernel;

/* A tile's loop over one block kernel, compiled with it (inlined, for the same instruction set). */
#define BLOCKS(NAME, BLOCK, R, C, ITEM, TARGET)                                                                       \
    TARGET static void NAME(const char *s, Py_ssize_t ss, char *d, Py_ssize_t ds, Py_ssize_t i0, Py_ssize_t i1,      \
                            Py_ssize_t j0, Py_ssize_t j1) {                                                           \
        for (Py_ssize_t i = i0; i < i1; i += (R))                                                                     \
            for (Py_ssize_t j = j0; j < j1; j += (C))                                                                 \
                BLOCK(s + i * ss + j * (ITEM), ss, d + j * ds + i * (ITEM), ds);                                      \
    }

/* The 8 x 8 network on 2-byte items, in each 128-bit lane: a0..a7 hold rows 0..7, then o0..o7 hold columns 0..7.
 * Written out statement by statement (no loops, no arrays), so that any optimisation level keeps it in registers. */
#define NET16(P, T)                                                                                                   \
    T b0 = P##_unpacklo_epi16(a0, a1), b1 = P##_unpackhi_epi16(a0, a1);                                               \
    T b2 = P##_unpacklo_epi16(a2, a3), b3 = P##_unpackhi_epi16(a2, a3);                                               \
    T b4 = P##_unpacklo_epi16(a4, a5), b5 = P##_unpackhi_epi16(a4, a5);                                               \
    T b6 = P##_unpacklo_epi16(a6, a7), b7 = P##_unpackhi_epi16(a6, a7);                                               \
    T c0 = P##_unpacklo_epi32(b0, b2), c1 = P##_unpackhi_epi32(b0, b2);                                               \
    T c2 = P##_unpacklo_epi32(b1, b3), c3 = P##_unpackhi_epi32(b1, b3);                                               \
    T c4 = P##_unpacklo_epi32(b4, b6), c5 = P##_unpackhi_epi32(b4, b6);                                               \
    T c6 = P##_unpacklo_epi32(b5, b7), c7 = P##_unpackhi_epi32(b5, b7);                                               \
    T o0 = P##_unpacklo_epi64(c0, c4), o1 = P##_unpackhi_epi64(c0, c4);                                               \
    T o2 = P##_unpacklo_epi64(c1, c5), o3 = P##_unpackhi_epi64(c1, c5);                                               \
    T o4 = P##_unpacklo_epi64(c2, c6), o5 = P##_unpackhi_epi64(c2, c6);                                               \
    T o6 = P##_unpacklo_epi64(c3, c7), o7 = P##_unpackhi_epi64(c3, c7);

/* The 4 x 4 network on 4-byte items, in each 128-bit lane: a0..a3 rows, o0..o3 columns. */
#define NET32(P, T)                                                                                                   \
    T b0 = P##_unpacklo_epi32(a0, a1), b1 = P##_unpackhi_epi32(a0, a1);                                               \
    T b2 = P##_unpacklo_epi32(a2, a3), b3 = P##_unpackhi_epi32(a2, a3);                                               \
    T o0 = P##_unpacklo_epi64(b0, b2), o1 = P##_unpackhi_epi64(b0, b2);                                               \
    T o2 = P##_unpacklo_epi64(b1, b3), o3 = P##_unpackhi_epi64(b1, b3);

/* Loads: lane j of register k is source row k + j * n (n = 8 for 2-byte items, 4 for 4-byte), so that column k of
 * the block's stacked rows comes out of the network contiguous, lane after lane, as one store. */
#define ROW(k) _mm_loadu_si128((const __m128i *)(s + (k) * ss))
#define LOAD4(L, n) T a0 = L(0, n), a1 = L(1, n), a2 = L(2, n), a3 = L(3, n);
#define LOAD8(L, n) LOAD4(L, n) T a4 = L(4, n), a5 = L(5, n), a6 = L(6, n), a7 = L(7, n);
#define STORE4(ST)                                                                                                    \
    ST((T *)(d + 0 * ds), o0); ST((T *)(d + 1 * ds), o1); ST((T *)(d + 2 * ds), o2); ST((T *)(d + 3 * ds), o3);
#define STORE8(ST)                                                                                                    \
    STORE4(ST)                                                                                                        \
    ST((T *)(d + 4 * ds), o4); ST((T *)(d + 5 * ds), o5); ST((T *)(d + 6 * ds), o6); ST((T *)(d + 7 * ds), o7);
#define ARGS const char *s, Py_ssize_t ss, char *d, Py_ssize_t ds

#ifdef HAVE_SSE2
#define T __m128i
#define ROWS1(k, n) ROW(k)
INLINE void sse2_16(ARGS) { LOAD8(ROWS1, 8) NET16(_mm, T) STORE8(_mm_storeu_si128) }
INLINE void sse2_32(ARGS) { LOAD4(ROWS1, 4) NET32(_mm, T) STORE4(_mm_storeu_si128) }
#undef T
BLOCKS(sse2_16s, sse2_16, 8, 8, 2, )
BLOCKS(sse2_32s, sse2_32, 4, 4, 4, )
#endif

#ifdef HAVE_WIDE
#define AVX2 __attribute__((target("avx2")))
#define AVX512 __attribute__((target("avx512f,avx512bw")))
#define ROWS2(k, n) _mm256_inserti128_si256(_mm256_castsi128_si256(ROW(k)), ROW((k) + (n)), 1)
#define ROWS4(k, n)                                                                                                   \
    _mm512_inserti32x4(                                                                                               \
        _mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(ROW(k)), ROW((k) + (n)), 1), ROW((k) + 2 * (n)), \
                           2),                                                                                        \
        ROW((k) + 3 * (n)), 3)
#define T __m256i
AVX2 INLINE void avx2_16(ARGS) { LOAD8(ROWS2, 8) NET16(_mm256, T) STORE8(_mm256_storeu_si256) }
AVX2 INLINE void avx2_32(ARGS) { LOAD4(ROWS2, 4) NET32(_mm256, T) STORE4(_mm256_storeu_si256) }
#undef T
#define T __m512i
AVX512 INLINE void avx512_16(ARGS) { LOAD8(ROWS4, 8) NET16(_mm512, T) STORE8(_mm512_storeu_si512) }
AVX512 INLINE void avx512_32(ARGS) { LOAD4(ROWS4, 4) NET32(_mm512, T) STORE4(_mm512_storeu_si512) }
#undef T
BLOCKS(avx2_16s, avx2_16, 16, 8, 2, AVX2)
BLOCKS(avx2_32s, avx2_32, 8, 4, 4, AVX2)
BLOCKS(avx512_16s, avx512_16, 32, 8, 2, AVX512)
BLOCKS(avx512_32s, avx512_32, 16, 4, 4, AVX512)
#endif

static const char *const LEVEL_NAMES[] = {"portable", "sse2", "avx2", "avx512"};

/* The best level this CPU (and its operating system, which must save the wider registers) supports. */
static int best_level(void) {
#ifdef HAVE_WIDE
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
        return 3;
    if (__builtin_cpu_supports("avx2"))
        return 2;
    return 1;
#elif defined(HAVE_SSE2)
    return 1;
#else
    return 0;
#endif
}

static kernel pick(Py_ssize_t item, int level) {
    kernel none = {NULL, 1, 1};
#ifdef HAVE_WIDE
    if (level >= 3 && item == 2)
        return (kernel){avx512_16s, 32, 8};
    if (level >= 3 && item == 4)
        return (kernel){avx512_32s, 16, 4};
    if (level >= 2 && item == 2)
        return (kernel){avx2_16s, 16, 8};
    if (level >= 2 && item == 4)
        return (kernel){avx2_32s, 8, 4};
#endif
#ifdef HAVE_SSE2
    if (level >= 1 && item == 2)
        return (kernel){sse2_16s, 8, 8};
    if (level >= 1 && item == 4)
        return (kernel){sse2_32s, 4, 4};
#endif
    (void)item;
    (void)level;
    return none;
}

/* Item by item: rows [r0, r1) x columns [c0, c1). */
static void items(const char *src, Py_ssize_t ss, char *dst, Py_ssize_t ds, Py_ssize_t item, Py_ssize_t r0,
                  Py_ssize_t r1, Py_ssize_t c0, Py_ssize_t c1) {
    for (Py_ssize_t r = r0; r < r1; r++)
        for (Py_ssize_t c = c0; c < c1; c++)
            memcpy(dst + c * ds + r * item, src + r * ss + c * item, (size_t)item);
}

/* dst[j][i] = src[i][j] for a (rows x cols) source; strides in bytes, each row's items contiguous. */
static void transpose(const char *src, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t ss, char *dst, Py_ssize_t ds,
                      Py_ssize_t item, kernel k) {
    Py_ssize_t n = item <= 2 ? 256 : 128; /* a multiple of every block's rows and columns */
    for (Py_ssize_t i0 = 0; i0 < rows; i0 += n) {
        Py_ssize_t i1 = rows - i0 < n ? rows : i0 + n;
        for (Py_ssize_t j0 = 0; j0 < cols; j0 += n) {
            Py_ssize_t j1 = cols - j0 < n ? cols : j0 + n;
            Py_ssize_t ib = i0, jb = j0; /* the end of the whole blocks (none without a kernel) */
            if (k.fn != NULL) {
                ib = i0 + (i1 - i0) / k.rows * k.rows;
                jb = j0 + (j1 - j0) / k.cols * k.cols;
                k.fn(src, ss, dst, ds, i0, ib, j0, jb);
            }
            items(src, ss, dst, ds, item, i0, ib, jb, j1); /* the columns right of the blocks */
            items(src, ss, dst, ds, item, ib, i1, j0, j1); /* the rows below them */
        }
    }
}

static PyObject *py_transpose(PyObject *self, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    int level = -1, best = best_level();
    if (!PyArg_ParseTuple(args, "OO|i:transpose", &src_obj, &dst_obj, &level))
        return NULL;
    if (level > best || level < -1) {
        PyErr_Format(PyExc_ValueError, "transpose: level %d asked for; this CPU has levels 0 to %d (%s)", level, best,
                     LEVEL_NAMES[best]);
        return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_STRIDES) < 0)
        return NULL;
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_STRIDES | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t item = src.itemsize;
    if (src.ndim != 2 || dst.ndim != 2) {
        PyErr_Format(PyExc_ValueError, "transpose: 2-D arrays expected, got %d-D and %d-D", src.ndim, dst.ndim);
    } else if (dst.itemsize != item || (item != 1 && item != 2 && item != 4 && item != 8)) {
        PyErr_Format(PyExc_ValueError, "transpose: item sizes %zd and %zd (1, 2, 4 or 8 bytes, the same)", item,
                     dst.itemsize);
    } else if (dst.shape[0] != src.shape[1] || dst.shape[1] != src.shape[0]) {
        PyErr_Format(PyExc_ValueError, "transpose: a (%zd, %zd) destination for a (%zd, %zd) source", dst.shape[0],
                     dst.shape[1], src.shape[0], src.shape[1]);
    } else if (src.strides[1] != item || dst.strides[1] != item || src.strides[0] < 0 || dst.strides[0] < 0) {
        PyErr_SetString(PyExc_ValueError, "transpose: each row's items must be contiguous, rows in order");
    } else {
        kernel k = pick(item, level < 0 ? best : level);
        Py_BEGIN_ALLOW_THREADS
        transpose(src.buf, src.shape[0], src.shape[1], src.strides[0], dst.buf, dst.strides[0], item, k);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"transpose", py_transpose, METH_VARARGS,
     "transpose(src, dst, level=LEVEL): dst[j, i] = src[i, j] for 2-D buffers of 1-, 2-, 4- or 8-byte items, each "
     "row's items contiguous, with the vector instructions of `level` at most (0 portable, 1 SSE2, 2 AVX2, 3 "
     "AVX-512); the GIL is released while it copies."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_transpose", NULL, -1, methods};

PyMODINIT_FUNC PyInit__transpose(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    int best = best_level();
    if (PyModule_AddIntConstant(m, "LEVEL", best) < 0 || PyModule_AddStringConstant(m, "ISA", LEVEL_NAMES[best]) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
