"""cublasGemmEx through ctypes on a handle of our own.

CuPy's cuBLAS wrappers refuse to run while a stream is being captured (its `setStream` raises
NotImplementedError), which kept every batch that needs a GEMM out of the decode CUDA graphs.
cuBLAS itself supports capture when the handle has a fixed workspace ("CUDA Graphs Support" in
the cuBLAS documentation), so the GEMMs go through the library CuPy already loaded, directly."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading

WORKSPACE_BYTES = 32 << 20
R_32F, R_16F, R_16BF = 0, 2, 14                       # cudaDataType
COMPUTE_32F, GEMM_DEFAULT, OP_N, OP_T = 68, -1, 0, 1  # cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t
_ONE, _ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)
_local = threading.local()


def _loaded_library_path() -> str | None:
    """Path of the libcublas CuPy loaded (not libcublasLt), from this process's memory map."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if path.rsplit("/", 1)[-1].startswith("libcublas.so"):
                    return path
    except OSError:
        pass
    return None


@functools.lru_cache(maxsize=None)
def _lib():
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas into the process)

    path = _loaded_library_path() or ctypes.util.find_library("cublas")
    if path is None:
        raise RuntimeError("cuBLAS: cannot find the libcublas that CuPy loaded")
    lib = ctypes.CDLL(path)
    vp, i = ctypes.c_void_p, ctypes.c_int
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasGemmEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
    ll = ctypes.c_longlong
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                               i, i, i]
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLAS: {what} failed with status {status}")


class _Handle:
    def __init__(self):
        import cupy

        lib = _lib()
        self.ptr = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.ptr)), "cublasCreate")
        self.workspace = cupy.cuda.Memory(WORKSPACE_BYTES)   # plain cudaMalloc: never pool-recycled
        _check(lib.cublasSetWorkspace_v2(self.ptr, self.workspace.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
        self.stream = None

    def on(self, stream_ptr: int):
        if stream_ptr != self.stream:
            _check(_lib().cublasSetStream_v2(self.ptr, stream_ptr), "cublasSetStream")
            self.stream = stream_ptr
        return self.ptr


def _handle(stream_ptr: int):
    import cupy

    key = cupy.cuda.Device().id
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    if key not in handles:
        handles[key] = _Handle()
    return handles[key].on(stream_ptr)


def gemm_ex(trans_a: int, trans_b: int, m: int, n: int, k: int, a_ptr: int, a_type: int, lda: int,
            b_ptr: int, b_type: int, ldb: int, c_ptr: int, c_type: int, ldc: int, compute_type: int,
            algo: int) -> None:
    """C = A @ B in cuBLAS's column-major terms (alpha 1, beta 0) on the current CuPy stream;
    safe inside stream capture."""
    import cupy

    h = _handle(cupy.cuda.get_current_stream().ptr)
    _check(_lib().cublasGemmEx(h, trans_a, trans_b, m, n, k, ctypes.byref(_ONE), a_ptr, a_type, lda, b_ptr,
                               b_type, ldb, ctypes.byref(_ZERO), c_ptr, c_type, ldc, compute_type, algo),
           "cublasGemmEx")


def gemm_strided_batched_ex(trans_a: int, trans_b: int, m: int, n: int, k: int, a_ptr: int, a_type: int, lda: int,
                            stride_a: int, b_ptr: int, b_type: int, ldb: int, stride_b: int, c_ptr: int, c_type: int,
                            ldc: int, stride_c: int, batch: int, compute_type: int, algo: int) -> None:
    """gemm_ex for `batch` matrices, the i-th of each at its pointer plus i times its stride
    (elements); safe inside stream capture."""
    import cupy

    h = _handle(cupy.cuda.get_current_stream().ptr)
    _check(_lib().cublasGemmStridedBatchedEx(h, trans_a, trans_b, m, n, k, ctypes.byref(_ONE), a_ptr, a_type, lda,
                                             stride_a, b_ptr, b_type, ldb, stride_b, ctypes.byref(_ZERO), c_ptr,
                                             c_type, ldc, stride_c, batch, compute_type, algo),
           "cublasGemmStridedBatchedEx")
