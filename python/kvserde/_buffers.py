"""Zero-copy access to caller memory: buffer-protocol objects and torch CPU tensors.

Nothing here copies KV data: every path resolves an object to (address, byte size)
and keeps the object (or its exported buffer) alive while C uses the memory.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_char_p, c_int, c_void_p, py_object

from .errors import InvalidError

Py_ssize_t = ctypes.c_ssize_t


class Py_buffer(Structure):
    _fields_ = [("buf", c_void_p), ("obj", c_void_p), ("len", Py_ssize_t),
                ("itemsize", Py_ssize_t), ("readonly", c_int), ("ndim", c_int),
                ("format", c_char_p), ("shape", POINTER(Py_ssize_t)),
                ("strides", POINTER(Py_ssize_t)), ("suboffsets", POINTER(Py_ssize_t)),
                ("internal", c_void_p)]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [py_object, POINTER(Py_buffer), c_int]
_GetBuffer.restype = c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = [POINTER(Py_buffer)]
_ReleaseBuffer.restype = None

PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004
PyBUF_C_CONTIGUOUS = 0x0038  # PyBUF_STRIDES | 0x20

# torch dtype name -> kvserde dtype name (torch is imported lazily, if ever).
TORCH_DTYPES = {"torch.uint8": "uint8", "torch.float32": "float32",
                "torch.float16": "float16", "torch.bfloat16": "bfloat16",
                "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}
NUMPY_DTYPES = {"uint8": "uint8", "float32": "float32", "float16": "float16"}


class BufferView:
    """An exported buffer held until :meth:`release` (or garbage collection)."""

    __slots__ = ("addr", "nbytes", "readonly", "_view", "_obj", "__weakref__")

    def __init__(self, obj, writable: bool, what: str):
        self._view = None
        view = Py_buffer()
        flags = PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0)
        try:
            _GetBuffer(obj, ctypes.byref(view), flags)
        except BufferError as e:
            if writable and _GetBuffer_readonly_ok(obj):
                raise InvalidError(f"{what}: a read-only buffer ({type(obj).__name__}) "
                                   "cannot be written; pass a bytearray, a writable array "
                                   "or a tensor") from None
            raise InvalidError(f"{what}: {type(obj).__name__} is not a C-contiguous buffer: "
                               f"{e}") from None
        self._view = view
        self._obj = obj
        self.addr = view.buf or 0
        self.nbytes = view.len
        self.readonly = bool(view.readonly)

    def release(self) -> None:
        if self._view is not None:
            _ReleaseBuffer(ctypes.byref(self._view))
            self._view = None
            self._obj = None

    def __del__(self):
        self.release()


def _GetBuffer_readonly_ok(obj) -> bool:
    view = Py_buffer()
    try:
        _GetBuffer(obj, ctypes.byref(view), PyBUF_C_CONTIGUOUS)
    except BufferError:
        return False
    _ReleaseBuffer(ctypes.byref(view))
    return True


_torch_dtypes: dict = {}  # torch.dtype object -> kvserde dtype name (filled lazily)


def _torch_dtype(t):
    d = t.dtype
    name = _torch_dtypes.get(d)
    if name is None:
        name = TORCH_DTYPES.get(str(d))
        _torch_dtypes[d] = name
    return name


def is_torch_tensor(obj) -> bool:
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "data_ptr")


def torch_info(t, what: str):
    """(address, nbytes, dtype name, shape) of a CPU, contiguous torch tensor."""
    if not t.is_cpu:
        raise InvalidError(f"{what}: tensor is on {t.device}; kvserde works on CPU tensors "
                           "(move it with .cpu() first)")
    if not t.is_contiguous():
        raise InvalidError(f"{what}: tensor of shape {tuple(t.shape)} with strides "
                           f"{t.stride()} is not contiguous; call .contiguous() first "
                           "(kvserde never copies it for you)")
    return t.data_ptr(), t.numel() * t.element_size(), _torch_dtype(t), t.shape


_fast: dict = {}  # type -> "torch" | "numpy" | "bytes" | "buffer"


def _kind(t, obj) -> str:
    k = _fast.get(t)
    if k is None:
        if t.__module__.startswith("torch") and hasattr(obj, "data_ptr") and \
                hasattr(obj, "is_contiguous"):
            k = "torch"
        elif t.__name__ == "ndarray" and t.__module__ == "numpy":
            k = "numpy"
        elif t is bytes:
            k = "bytes"
        else:
            k = "buffer"
        _fast[t] = k
    return k


def resolve(obj, writable: bool, what: str):
    """(address, nbytes, dtype name or None, shape or None, keepalive).

    keepalive is the object itself or a :class:`BufferView` to release when C is done.
    Torch tensors go through data_ptr() (no storage copy), numpy arrays through
    __array_interface__, bytes through their internal buffer, anything else through
    the buffer protocol (PyObject_GetBuffer with PyBUF_C_CONTIGUOUS).
    """
    k = _kind(type(obj), obj)
    if k == "torch":
        addr, n, dt, shape = torch_info(obj, what)
        return addr, n, dt, shape, obj
    if k == "numpy":
        # (__array_interface__ builds a dict per call: the buffer protocol is cheaper)
        if not obj.flags.c_contiguous:
            raise InvalidError(f"{what}: numpy array of shape {obj.shape} with strides "
                               f"{obj.strides} is not C-contiguous; use "
                               "numpy.ascontiguousarray first (kvserde never copies it)")
        if writable and not obj.flags.writeable:
            raise InvalidError(f"{what}: numpy array is read-only")
        bv = BufferView(obj, writable, what)
        return bv.addr, bv.nbytes, NUMPY_DTYPES.get(obj.dtype.name), obj.shape, bv
    if k == "bytes":
        if writable:
            raise InvalidError(f"{what}: bytes are read-only; pass a bytearray, a writable "
                               "array or a tensor")
        addr = ctypes.cast(ctypes.c_char_p(obj), c_void_p).value or 0
        return addr, len(obj), None, None, obj
    bv = BufferView(obj, writable, what)
    return bv.addr, bv.nbytes, None, None, bv


def resolve_bytes(obj, writable: bool, what: str):
    """(address, nbytes, keepalive) only: the cheaper form for blob buffers."""
    if _kind(type(obj), obj) == "torch":
        if not obj.is_cpu or not obj.is_contiguous():
            torch_info(obj, what)  # raises the explanatory error
        return obj.data_ptr(), obj.numel() * obj.element_size(), obj
    addr, n, _, _, keep = resolve(obj, writable, what)
    return addr, n, keep


def release(keepalive) -> None:
    if type(keepalive) is BufferView:
        keepalive.release()
