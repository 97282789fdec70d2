"""The Python API over libkvserde: layouts, keys, serdes, processors, L2 adapters."""

from __future__ import annotations

import ctypes
import json
import threading
from ctypes import byref, c_char_p, c_int, c_int64, c_size_t, c_uint8, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence, Union

from . import _buffers as _b
from . import _ffi as F
from .errors import ClosedError, Error, InvalidError, error_for

lib = F.lib

DTYPES = {"uint8": 0, "float32": 1, "float16": 2, "bfloat16": 3,
          "float8_e4m3fn": 4, "float8_e5m2": 5}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {"uint8": 1, "float32": 4, "float16": 2, "bfloat16": 2,
               "float8_e4m3fn": 1, "float8_e5m2": 1}

FMT_UNDEFINED, FMT_BINARY_BUFFER = 0, 5

Config = Union[str, dict]


def _check(rc: int) -> int:
    if rc < 0:
        raise error_for(rc, (lib.kvs_last_error() or b"").decode("utf-8", "replace"))
    return rc


def _config_text(config: Config) -> bytes:
    if isinstance(config, (dict, list)):
        return json.dumps(config).encode()
    if isinstance(config, bytes):
        return config
    if isinstance(config, str):
        return config.encode()
    raise InvalidError(f"config must be a JSON string or a dict, got {type(config).__name__}")


def version() -> str:
    """The version of the loaded libkvserde (``"0.1.0"``)."""
    return lib.kvs_version().decode()


def strerror(code: int) -> str:
    """The fixed description of a status code (``"invalid argument"``)."""
    return lib.kvs_strerror(code).decode()


def _names(fn) -> list:
    n = fn(None, 0)
    arr = (c_char_p * max(n, 1))()
    fn(arr, n)
    return [arr[i].decode() for i in range(n)]


def serde_types() -> dict:
    """Registered serde types and their kind: ``{"fp8": "single", "kv_split": "multi", ...}``."""
    out = {}
    for name in _names(lib.kvs_serde_types):
        kind = c_int()
        _check(lib.kvs_serde_type_kind(name.encode(), byref(kind)))
        out[name] = "multi" if kind.value == F.KVS_SERDE_MULTI else "single"
    return out


def pipeline_stage_types() -> list:
    """The stage types of the ``pipeline`` serde (``["bytes", "fp8", "transform", "crc32c", ...]``)."""
    return _names(lib.kvs_pipeline_stage_types)


def l2_types() -> list:
    """Registered L2 adapter types (``["fs", "memory", "redis"]``)."""
    return _names(lib.kvs_l2_types)


def fp8_isa() -> str:
    """The fp8 kernel variant in use (``"avx512fp16"``, ``"avx512"``, ``"avx2"``, ``"scalar"``)."""
    return lib.kvs_fp8_isa().decode()


def consume_event_fd(fd: int) -> int:
    """Drain a kvserde event fd: return its counter (finished tasks; 0 if none) and reset it."""
    n = c_uint64()
    _check(lib.kvs_event_fd_consume(fd, byref(n)))
    return n.value


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype (kvserde name, ``"torch.bfloat16"``, a torch or numpy dtype)."""
    s = str(getattr(dtype, "name", None) if type(dtype).__module__.startswith("numpy")
            else dtype)
    if s.startswith("torch."):
        s = s[6:]
    if s not in DTYPES:
        raise InvalidError(f"dtype: unknown dtype '{dtype}'; known: " + ", ".join(DTYPES))
    return s


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------
class Layout:
    """Groups of (shape, dtype) packed back to back: upstream ``MemoryLayoutDesc``.

    ``Layout([(2, 4, 16, 64)], ["bfloat16"])`` or ``Layout.of(tensor)``; validated
    by the C library (at most 16 groups of at most 8 dims).
    """

    __slots__ = ("shapes", "dtypes", "_c", "_nbytes", "__weakref__")

    def __init__(self, shapes: Sequence[Sequence[int]], dtypes: Sequence[Any]):
        shapes = [tuple(int(d) for d in s) for s in shapes]
        dtypes = [dtype_name(d) for d in dtypes]
        if len(shapes) != len(dtypes):
            raise InvalidError(f"layout: shapes and dtypes must have the same length: "
                               f"{len(shapes)} shapes, {len(dtypes)} dtypes")
        c = F.kvs_layout()
        for s, d in zip(shapes, dtypes):
            dims = (c_int64 * max(len(s), 1))(*s)
            _check(lib.kvs_layout_add_group(byref(c), len(s), dims, DTYPES[d]))
        self.shapes = shapes
        self.dtypes = dtypes
        self._c = c
        self._nbytes = lib.kvs_layout_nbytes(byref(c))

    @classmethod
    def flat(cls, nbytes: int) -> "Layout":
        """One ``uint8 [nbytes]`` group (a serialized blob's layout)."""
        return cls([(nbytes,)], ["uint8"])

    @classmethod
    def of(cls, obj: Any) -> "Layout":
        """The layout of a tensor / array (its shape and dtype), a Layout, a MemoryObject,
        anything with get_shapes()/get_dtypes() or shapes/dtypes (LMCache), or any
        other buffer as flat uint8 bytes."""
        if isinstance(obj, Layout):
            return obj
        if isinstance(obj, MemoryObject):
            return obj.layout
        if hasattr(obj, "get_shapes") and hasattr(obj, "get_dtypes"):
            return cls(obj.get_shapes(), obj.get_dtypes())
        if hasattr(obj, "shapes") and hasattr(obj, "dtypes"):
            return cls(obj.shapes, obj.dtypes)
        return _layout_of_buffer(obj, "layout")

    @classmethod
    def _from_c(cls, c: F.kvs_layout) -> "Layout":
        shapes = [tuple(c.groups[i].shape.dims[:c.groups[i].shape.ndim])
                  for i in range(c.ngroups)]
        dtypes = [DTYPE_NAMES[c.groups[i].dtype] for i in range(c.ngroups)]
        return cls(shapes, dtypes)

    @property
    def nbytes(self) -> int:
        """Total bytes of every group (kvs_layout_nbytes)."""
        return self._nbytes

    @property
    def numel(self) -> int:
        """Total elements of every group."""
        return lib.kvs_layout_numel(byref(self._c))

    def group_offset(self, i: int) -> int:
        """Byte offset of group i from the start of the object."""
        if not 0 <= i < len(self.shapes):
            raise IndexError(i)
        return lib.kvs_layout_group_offset(byref(self._c), i)

    def group_nbytes(self, i: int) -> int:
        """Byte size of group i."""
        if not 0 <= i < len(self.shapes):
            raise IndexError(i)
        return lib.kvs_layout_group_nbytes(byref(self._c), i)

    def __len__(self) -> int:
        return len(self.shapes)

    def __eq__(self, other) -> bool:
        return isinstance(other, Layout) and bool(lib.kvs_layout_equal(byref(self._c),
                                                                        byref(other._c)))

    def __hash__(self) -> int:
        return hash((tuple(self.shapes), tuple(self.dtypes)))

    def __str__(self) -> str:
        buf = ctypes.create_string_buffer(1024)
        return lib.kvs_layout_format(byref(self._c), buf, 1024).decode()

    def __repr__(self) -> str:
        return f"Layout({self.shapes!r}, {self.dtypes!r})"


_layout_cache: dict = {}
_LAYOUT_CACHE_MAX = 256


def _cached_layout(shape: tuple, dt: str) -> Layout:
    k = (shape, dt)
    lay = _layout_cache.get(k)
    if lay is None:
        shape = tuple(shape)
        lay = Layout([shape], [dt])
        if len(_layout_cache) >= _LAYOUT_CACHE_MAX:
            _layout_cache.clear()
        _layout_cache[k] = lay
    return lay


def _layout_of_buffer(obj, what: str) -> Layout:
    addr, n, dt, shape, keep = _b.resolve(obj, False, what)
    _b.release(keep)
    if dt is not None and shape is not None:
        return _cached_layout(tuple(shape), dt)
    return _cached_layout((n,), "uint8")


# ---------------------------------------------------------------------------
# Object key
# ---------------------------------------------------------------------------
class ObjectKey:
    """The identity of one stored KV object (upstream ``ObjectKey``), validated by C.

    ``ObjectKey(b"\\x00\\x01", "meta-llama/Llama-3-8B", kv_rank=0, object_group_id=0,
    cache_salt="")``
    """

    __slots__ = ("chunk_hash", "model_name", "kv_rank", "object_group_id", "cache_salt",
                 "_c")

    def __init__(self, chunk_hash: bytes, model_name: str, kv_rank: int = 0,
                 object_group_id: int = 0, cache_salt: str = ""):
        if isinstance(chunk_hash, int):
            chunk_hash = chunk_hash.to_bytes(8, "big", signed=chunk_hash < 0)
        elif isinstance(chunk_hash, str):
            chunk_hash = chunk_hash.encode()
        chunk_hash = bytes(chunk_hash)
        c = F.kvs_object_key()
        _check(lib.kvs_object_key_init(byref(c), chunk_hash, len(chunk_hash),
                                       str(model_name).encode(), int(kv_rank),
                                       int(object_group_id),
                                       (cache_salt or "").encode()))
        self.chunk_hash = chunk_hash
        self.model_name = str(model_name)
        self.kv_rank = int(kv_rank)
        self.object_group_id = int(object_group_id)
        self.cache_salt = cache_salt or ""
        self._c = c

    @classmethod
    def of(cls, key: Any) -> Optional["ObjectKey"]:
        """An ObjectKey from None, an ObjectKey, or any object with LMCache's ObjectKey
        attributes (chunk_hash, model_name, kv_rank, and optionally object_group_id,
        cache_salt)."""
        if key is None or isinstance(key, ObjectKey):
            return key
        return cls(getattr(key, "chunk_hash"), getattr(key, "model_name"),
                   getattr(key, "kv_rank", 0) or 0,
                   getattr(key, "object_group_id", 0) or 0,
                   getattr(key, "cache_salt", "") or "")

    @property
    def fingerprint(self) -> int:
        """The 64-bit fingerprint a framed blob records (XXH3-64 of the canonical bytes)."""
        return lib.kvs_object_key_fingerprint(byref(self._c))

    def temp_key(self) -> "ObjectKey":
        """upstream make_temp_key: the hash plus 16 random bytes, other fields copied."""
        out = F.kvs_object_key()
        _check(lib.kvs_make_temp_key(byref(self._c), byref(out)))
        return ObjectKey(bytes(out.chunk_hash[:out.chunk_hash_len]), self.model_name,
                         self.kv_rank, self.object_group_id, self.cache_salt)

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectKey) and bool(
            lib.kvs_object_key_equal(byref(self._c), byref(other._c)))

    def __hash__(self) -> int:
        return hash((self.chunk_hash, self.model_name, self.kv_rank, self.object_group_id,
                     self.cache_salt))

    def __repr__(self) -> str:
        return (f"ObjectKey({self.chunk_hash!r}, {self.model_name!r}, kv_rank="
                f"{self.kv_rank}, object_group_id={self.object_group_id}, "
                f"cache_salt={self.cache_salt!r})")


def _keyp(key):
    k = ObjectKey.of(key)
    return None if k is None else byref(k._c)


def _key_array(keys, n: int):
    if keys is None:
        return None
    keys = list(keys)
    if len(keys) != n:
        raise InvalidError(f"{len(keys)} keys for {n} objects")
    arr = (F.kvs_object_key * max(n, 1))()
    for i, k in enumerate(keys):
        k = ObjectKey.of(k)
        if k is None:
            raise InvalidError(f"key {i} is None (pass keys=None for no keys at all)")
        arr[i] = k._c
    return arr


# ---------------------------------------------------------------------------
# Memory objects
# ---------------------------------------------------------------------------
class MemoryObject:
    """Caller memory (a tensor or buffer, never copied) with a layout: ``MemoryObj``.

    ``MemoryObject(tensor)`` takes the tensor's shape and dtype;
    ``MemoryObject(bytearray(n))`` is ``uint8 [n]``; ``MemoryObject(buf, layout)`` pairs
    any buffer with a layout (the buffer must hold at least layout.nbytes bytes).
    ``used_size`` is the logical size: a processor narrows a serialize destination to
    the bytes written, an L2 load sets it to the stored size.
    """

    __slots__ = ("obj", "layout", "_c", "_keep", "__weakref__")

    def __init__(self, obj: Any, layout: Optional[Layout] = None, fmt: int = FMT_UNDEFINED,
                 *, writable: bool = True, used_size: Optional[int] = None):
        addr, n, dt, shape, keep = _b.resolve(obj, writable, "memory object")
        if layout is None:
            if dt is not None and shape is not None:
                layout = _cached_layout(tuple(shape), dt)
            else:
                layout = _cached_layout((n,), "uint8")
                if fmt == FMT_UNDEFINED:
                    fmt = FMT_BINARY_BUFFER
        elif not isinstance(layout, Layout):
            layout = Layout.of(layout)
        c = F.kvs_memobj()
        try:
            _check(lib.kvs_memobj_init(byref(c), addr or None, n, byref(layout._c), fmt))
            if used_size is not None:
                _check(lib.kvs_memobj_set_used_size(byref(c), used_size))
        except Error:
            _b.release(keep)
            raise
        self.obj = obj
        self.layout = layout
        self._c = c
        self._keep = keep

    @classmethod
    def from_address(cls, addr: int, capacity: int, layout: Layout,
                     fmt: int = FMT_UNDEFINED, keepalive: Any = None,
                     used_size: Optional[int] = None) -> "MemoryObject":
        """Describe memory by address (e.g. an LMCache MemoryObj's data_ptr): the caller
        guarantees ``capacity`` bytes at ``addr`` stay valid while kvserde uses them;
        ``keepalive`` is held as long as this object."""
        self = cls.__new__(cls)
        c = F.kvs_memobj()
        _check(lib.kvs_memobj_init(byref(c), addr or None, capacity, byref(layout._c), fmt))
        if used_size is not None:
            _check(lib.kvs_memobj_set_used_size(byref(c), used_size))
        self.obj = keepalive
        self.layout = layout
        self._c = c
        self._keep = keepalive
        return self

    @property
    def data_ptr(self) -> int:
        """The address of the first byte (the caller's own memory)."""
        return self._c.data or 0

    @property
    def capacity(self) -> int:
        return self._c.capacity

    @property
    def used_size(self) -> int:
        """The logical size in bytes."""
        return self._c.used_size

    def set_used_size(self, n: int) -> None:
        """Narrow (or widen back) the logical size: 0 <= n <= capacity."""
        _check(lib.kvs_memobj_set_used_size(byref(self._c), n))

    def release(self) -> None:
        """Let go of the exported buffer (the object is unusable afterwards)."""
        _b.release(self._keep)
        self._keep = None

    def __repr__(self) -> str:
        return f"MemoryObject({self.layout}, used_size={self.used_size})"


def _resolve(obj, writable: bool, what: str):
    if isinstance(obj, MemoryObject):
        return obj.data_ptr, obj.capacity, None, None, obj
    return _b.resolve(obj, writable, what)


def _as_memobj(obj, writable: bool, layout=None) -> MemoryObject:
    if isinstance(obj, MemoryObject):
        return obj
    return MemoryObject(obj, layout, writable=writable)


# Per-thread scratch memobj structs for the sync calls, so a call allocates nothing.
_tls = threading.local()


def _scratch():
    """This thread's structs for the sync calls: (serialize source, serialize blob,
    deserialize blob, deserialize destination, nwritten, their byrefs, and views of the
    two blob structs' single dim). Each struct keeps one role, so a typed layout copied
    into a source / destination stays valid for the next call with the same layout."""
    s = getattr(_tls, "s", None)
    if s is None:
        ss, sb, db, dd, nw = F.kvs_memobj(), F.kvs_memobj(), F.kvs_memobj(), \
            F.kvs_memobj(), c_size_t()
        for c in (ss, dd):
            _last_layout.pop(id(c), None)  # an id a dead thread's struct may have had
        # A blob's layout is one flat uint8 group whose size alone changes: a view of
        # that one int64 lets a call set it without copying a layout.
        off = (F.kvs_memobj.layout.offset + F.kvs_layout.groups.offset +
               F.kvs_group.shape.offset + F.kvs_shape.dims.offset)
        for c in (sb, db):
            c.layout = Layout.flat(0)._c
            c.format = FMT_BINARY_BUFFER
        s = _tls.s = (ss, sb, db, dd, nw, byref(ss), byref(sb), byref(db), byref(dd),
                      byref(nw), c_int64.from_buffer(sb, off), c_int64.from_buffer(db, off))
    return s


_last_layout: dict = {}  # id(struct) -> the Layout last copied into it


def _fill(c: F.kvs_memobj, addr: int, n: int, layout: Layout, fmt: int, what: str):
    need = layout._nbytes
    if n < need:
        raise error_for(-2, f"{what}: buffer holds {n} bytes, layout {layout} needs {need}")
    c.data = addr or None
    c.capacity = n
    c.used_size = need
    k = id(c)
    if _last_layout.get(k) is not layout:  # a 1288-byte copy only when it changes
        c.layout = layout._c
        _last_layout[k] = layout
    c.format = fmt


def _src_layout(layout, dt, shape, n):
    if layout is not None:
        return layout if isinstance(layout, Layout) else Layout.of(layout)
    if dt is not None and shape is not None:
        return _cached_layout(shape, dt)
    return _cached_layout((n,), "uint8")


class _Closable:
    _what = "object"

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _live(self):
        h = self._h
        if not h:
            raise ClosedError(f"{self._what}: already closed")
        return h


# ---------------------------------------------------------------------------
# Sync serde pair
# ---------------------------------------------------------------------------
class Serde(_Closable):
    """A serializer / deserializer pair made from a config (:func:`create_serde`)."""

    _what = "serde"

    def __init__(self, config: Config):
        self.config = config
        self._pair = F.kvs_serde_pair()
        _check(lib.kvs_serde_create_pair(_config_text(config), byref(self._pair)))
        self._h = self._pair.serializer
        self.max_workers = self._pair.max_workers

    def estimate(self, layout: Any) -> int:
        """Upper bound on the bytes serialize writes for an object of ``layout`` (a
        Layout, a tensor or anything :meth:`Layout.of` accepts)."""
        lay = Layout.of(layout)
        n = c_size_t()
        _check(lib.kvs_estimate_serialized_size(self._live(), byref(lay._c), byref(n)))
        return n.value

    def serialize(self, src: Any, dst: Any = None, key: Any = None, *,
                  layout: Optional[Layout] = None) -> Union[int, bytearray]:
        """Serialize ``src`` (tensor / array / buffer; its layout from its shape and dtype,
        or ``layout``) into ``dst`` (a writable buffer) and return the bytes written;
        with ``dst=None`` return a new bytearray of exactly the serialized bytes.
        ``key``: the object key (ObjectKey or LMCache-like), or None."""
        ser = self._live()
        if isinstance(src, MemoryObject):
            layout = layout or src.layout
        saddr, sn, sdt, sshape, skeep = _resolve(src, False, "serialize: source")
        lay = _src_layout(layout, sdt, sshape, sn)
        own = None
        if dst is None:
            own = bytearray(self.estimate(lay))
            dst = own
        if isinstance(dst, MemoryObject):
            daddr, dn, dkeep = dst.data_ptr, dst.capacity, dst
        else:
            daddr, dn, dkeep = _b.resolve_bytes(dst, True, "serialize: destination")
        try:
            cs, cd, _, _, nw, pcs, pcd, _, _, pnw, ddim, _ = _scratch()
            _fill(cs, saddr, sn, lay, FMT_UNDEFINED, "serialize: source")
            cd.data = daddr or None
            cd.capacity = dn
            cd.used_size = dn
            ddim.value = dn
            rc = lib.kvs_serialize(ser, pcs, pcd, None if key is None else _keyp(key), pnw)
            if rc < 0:
                _check(rc)
            n = nw.value
        finally:
            if skeep is not src:
                _b.release(skeep)
            if dkeep is not dst:
                _b.release(dkeep)
        if own is not None:
            del own[n:]  # shrinks in place (realloc), no copy of the bytes
            return own
        return n

    def deserialize(self, src: Any, dst: Any, key: Any = None, *,
                    layout: Optional[Layout] = None, size: Optional[int] = None) -> None:
        """Decode the serialized bytes ``src`` (its first ``size`` bytes; all by default)
        into ``dst`` (a writable tensor / array / buffer; the layout to produce comes from
        its shape and dtype, or ``layout``)."""
        de = self._live() and self._pair.deserializer
        if isinstance(src, MemoryObject) and size is None:
            size = src.used_size
        if isinstance(dst, MemoryObject):
            layout = layout or dst.layout
        if isinstance(src, MemoryObject):
            saddr, sn, skeep = src.data_ptr, src.capacity, src
        else:
            saddr, sn, skeep = _b.resolve_bytes(src, False, "deserialize: source")
        daddr, dn, ddt, dshape, dkeep = _resolve(dst, True, "deserialize: destination")
        try:
            lay = _src_layout(layout, ddt, dshape, dn)
            _, _, cs, cd, _, _, _, pcs, pcd, _, _, sdim = _scratch()
            used = sn if size is None else size
            if not 0 <= used <= sn:
                raise InvalidError(f"deserialize: size {used} out of range [0, {sn}]")
            cs.data = saddr or None
            cs.capacity = sn
            cs.used_size = used
            sdim.value = sn
            _fill(cd, daddr, dn, lay, FMT_UNDEFINED, "deserialize: destination")
            rc = lib.kvs_deserialize(de, pcs, pcd, None if key is None else _keyp(key))
            if rc < 0:
                _check(rc)
        finally:
            if skeep is not src:
                _b.release(skeep)
            if dkeep is not dst:
                _b.release(dkeep)

    def verify(self, blob: Any, key: Any = None) -> None:
        """pipeline serdes: check a stored frame (header, key binding, checksums, tag)
        without decoding it; raises the error deserialize would raise."""
        de = self._live() and self._pair.deserializer
        addr, n, _, _, keep = _b.resolve(blob, False, "verify")
        try:
            _check(lib.kvs_pipeline_verify(de, addr or None, n, _keyp(key)))
        finally:
            _b.release(keep)

    def close(self) -> None:
        """Free the C serializer and deserializer (idempotent; also on GC)."""
        if getattr(self, "_h", None):
            self._h = None
            lib.kvs_serde_pair_destroy(byref(self._pair))


def _layout_ptrs(layouts):
    """A C array of layout pointers (NULL for None: an absent slot) and its length; the
    Layouts stay alive through the array's references."""
    lays = [None if x is None else Layout.of(x) for x in layouts]
    arr = (F.LAYP * max(len(lays), 1))()
    for i, x in enumerate(lays):
        if x is not None:
            arr[i] = ctypes.pointer(x._c)
    return arr, len(lays)


class MultiSerde(_Closable):
    """A multi-output serde pair (``kv_split``): a group of optional tensors <-> one blob."""

    _what = "multi serde"

    def __init__(self, config: Config):
        self.config = config
        self._pair = F.kvs_multi_serde_pair()
        _check(lib.kvs_multi_serde_create_pair(_config_text(config), byref(self._pair)))
        self._h = self._pair.serializer
        self.group_size = lib.kvs_multi_serializer_group_size(self._h)
        self.max_workers = self._pair.max_workers

    def _group(self, objs, writable):
        objs = list(objs)
        if len(objs) != self.group_size:
            raise InvalidError(f"multi serde: group of {len(objs)}, expected "
                               f"{self.group_size}")
        mos = [None if o is None else _as_memobj(o, writable) for o in objs]
        arr = (F.MEMP * self.group_size)(*[
            ctypes.cast(None, F.MEMP) if m is None else ctypes.pointer(m._c) for m in mos])
        return mos, arr

    def estimate(self, layouts: Sequence[Any]) -> int:
        """Blob size bound for a group of layouts (None for an absent slot)."""
        arr, k = _layout_ptrs(layouts)
        n = c_size_t()
        _check(lib.kvs_multi_estimate_serialized_size(self._live(), arr, k, byref(n)))
        return n.value

    def serialize(self, group: Sequence[Any], dst: Any = None, key: Any = None):
        """Serialize a group (None for absent slots) into dst; bytes written, or a new
        bytearray when dst is None."""
        ser = self._live()
        mos, arr = self._group(group, False)
        own = None
        if dst is None:
            own = dst = bytearray(self.estimate([None if m is None else m.layout
                                                 for m in mos]))
        d = _as_memobj(dst, True)
        n = c_size_t()
        _check(lib.kvs_multi_serialize(ser, arr, len(mos), byref(d._c), _keyp(key),
                                       byref(n)))
        if own is not None:
            d.release()
            del own[n.value:]
            return own
        return n.value

    def deserialize(self, src: Any, group: Sequence[Any], key: Any = None) -> None:
        """Fill the present slots of ``group`` from the blob ``src``."""
        de = self._live() and self._pair.deserializer
        s = _as_memobj(src, False)
        mos, arr = self._group(group, True)
        _check(lib.kvs_multi_deserialize(de, byref(s._c), arr, len(mos), _keyp(key)))

    def close(self) -> None:
        if getattr(self, "_h", None):
            self._h = None
            lib.kvs_multi_serde_pair_destroy(byref(self._pair))


def create_serde(config: Config) -> Union[Serde, MultiSerde]:
    """Build a serde from a config (JSON text or dict: ``{"type": "fp8"}``,
    ``{"type": "pipeline", "stages": [...]}``, ``{"type": "kv_split"}``): a :class:`Serde`
    for single-output types, a :class:`MultiSerde` for multi-output ones."""
    return MultiSerde(config) if _is_multi(config) else Serde(config)


def _is_multi(config: Config) -> bool:
    try:
        t = json.loads(_config_text(config)).get("type")
    except Exception:
        return False  # the C side reports the bad config
    kind = c_int()
    return isinstance(t, str) and lib.kvs_serde_type_kind(t.encode(), byref(kind)) == 0 \
        and kind.value == F.KVS_SERDE_MULTI


# ---------------------------------------------------------------------------
# Async processor
# ---------------------------------------------------------------------------
@dataclass
class TaskResult:
    """A finished processor task: ``ok``; on failure ``status`` (KVS_E* code), ``message``
    and ``failed_index``; ``used_sizes``: each destination's used size (serialize: the
    bytes written per object)."""

    ok: bool
    status: int = 0
    message: str = ""
    failed_index: int = 0
    used_sizes: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    @property
    def error(self) -> Optional[Error]:
        """The exception for a failed task (None when ok)."""
        return None if self.ok else error_for(self.status, self.message)

    def raise_for_error(self) -> None:
        if not self.ok:
            raise error_for(self.status, self.message)


def _memarray(mos):
    arr = (F.MEMP * max(len(mos), 1))()
    for i, m in enumerate(mos):
        if m is not None:  # None: an absent slot of a multi-output group (NULL)
            arr[i] = ctypes.pointer(m._c)
    return arr


class Processor(_Closable):
    """kvserde's async processor (upstream ``AsyncSerdeProcessor``) built from a config.

    Submits return a task id at once; each finished task makes its direction's event fd
    (:attr:`serialize_event_fd`, :attr:`deserialize_event_fd`) readable by exactly one
    count, for ``selectors`` or ``asyncio``'s ``loop.add_reader``; query pops the result
    once (then ``None``). Objects stay referenced (never copied) until their result is
    popped or the processor is closed.
    """

    _what = "processor"
    _create, _destroy = lib.kvs_serde_create, lib.kvs_processor_destroy
    _qser = lib.kvs_processor_query_serialize_result
    _qde = lib.kvs_processor_query_deserialize_result

    def __init__(self, config: Config):
        h = c_void_p()
        _check(type(self)._create(_config_text(config), byref(h)))
        self._h = h.value
        self.config = config
        self._lock = threading.Lock()
        self._inflight: dict = {}
        self._fds()

    def _fds(self):
        self._sfd = lib.kvs_processor_serialize_event_fd(self._h)
        self._dfd = lib.kvs_processor_deserialize_event_fd(self._h)

    @property
    def serialize_event_fd(self) -> int:
        """The fd signalled once per finished serialize task (do not close it)."""
        self._live()
        return self._sfd

    @property
    def deserialize_event_fd(self) -> int:
        """The fd signalled once per finished deserialize task (do not close it)."""
        self._live()
        return self._dfd

    def set_split(self, min_bytes: int, chunk_bytes: int = 0) -> None:
        """Split objects of at least min_bytes across idle workers (processor.h)."""
        _check(lib.kvs_async_processor_set_split(self._live(), min_bytes, chunk_bytes))

    def estimate(self, layout: Any) -> int:
        """The buffer size to allocate for serializing an object of ``layout``."""
        lay = Layout.of(layout)
        n = c_size_t()
        _check(lib.kvs_processor_estimate_serialized_size(self._live(), byref(lay._c),
                                                          byref(n)))
        return n.value

    def _submit_raw(self, call, src: list, dst: list) -> int:
        """Wrap src (read) and dst (written; None: an absent slot), call
        call(handle, src array, dst array, &id) and keep every struct and object alive
        until the result is popped (C reads them until then)."""
        h = self._live()
        smo = [None if o is None else _as_memobj(o, False) for o in src]
        dmo = [None if o is None else _as_memobj(o, True) for o in dst]
        tid = c_uint64()
        with self._lock:  # the id is recorded before any other thread can pop it
            _check(call(h, _memarray(smo), _memarray(dmo), byref(tid)))
            self._inflight[tid.value] = (dmo, _made(smo + dmo, src + dst), smo)
        return tid.value

    def _submit(self, fn, src, dst, keys) -> int:
        src, dst = list(src), list(dst)
        if len(src) != len(dst):
            raise InvalidError(f"processor: {len(src)} sources but {len(dst)} destinations")
        karr = _key_array(keys, len(src))
        return self._submit_raw(lambda h, s, d, i: fn(h, s, len(src), d, len(dst), karr, i),
                                src, dst)

    def submit_serialize(self, src: Iterable[Any], dst: Iterable[Any],
                         keys: Optional[Iterable[Any]] = None) -> int:
        """Queue serialize src[i] -> dst[i] (keys[i], or no keys); returns the task id."""
        return self._submit(lib.kvs_processor_submit_serialize, src, dst, keys)

    def submit_deserialize(self, src: Iterable[Any], dst: Iterable[Any],
                           keys: Optional[Iterable[Any]] = None) -> int:
        """Queue deserialize of the blobs src[i] into dst[i]; returns the task id."""
        return self._submit(lib.kvs_processor_submit_deserialize, src, dst, keys)

    def _query(self, fn, tid: int) -> Optional[TaskResult]:
        h = self._h
        if not h:
            return None
        r = F.kvs_task_result()
        _check(fn(h, tid, byref(r)))
        if r.state == F.KVS_TASK_PENDING:
            return None
        with self._lock:
            entry = self._inflight.pop(tid, None)
        sizes = [m.used_size for m in entry[0] if m is not None] if entry else []
        if entry:
            for m in entry[1]:
                m.release()
        return TaskResult(r.state == F.KVS_TASK_OK, r.status,
                          r.message.decode("utf-8", "replace"), r.failed_index, sizes)

    def query_serialize_result(self, task_id: int) -> Optional[TaskResult]:
        """The serialize task's result, once; None while pending (or already popped)."""
        return self._query(type(self)._qser, task_id)

    def query_deserialize_result(self, task_id: int) -> Optional[TaskResult]:
        """The deserialize task's result, once; None while pending (or already popped)."""
        return self._query(type(self)._qde, task_id)

    def close(self) -> None:
        """Finish every accepted task, join the threads, close the fds, free (idempotent;
        also on GC). Unpopped results are dropped."""
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            type(self)._destroy(h)  # close (waits for tasks), then free
            self._inflight.clear()


class MultiProcessor(Processor):
    """The async processor of a multi-output serde (``kv_split``): items are groups of
    ``group_size`` tensors / buffers (``None`` for an absent slot) <-> one blob each.
    Same fds, ids, pop-once queries and cleanup as :class:`Processor`."""

    _what = "multi processor"
    _create, _destroy = lib.kvs_multi_serde_create, lib.kvs_multi_processor_destroy
    _qser = lib.kvs_multi_processor_query_serialize_result
    _qde = lib.kvs_multi_processor_query_deserialize_result

    def _fds(self):
        self.group_size = lib.kvs_multi_processor_group_size(self._h)
        self._sfd = lib.kvs_multi_processor_serialize_event_fd(self._h)
        self._dfd = lib.kvs_multi_processor_deserialize_event_fd(self._h)

    def _flat(self, groups):
        flat = []
        for i, g in enumerate(groups):
            g = list(g)
            if len(g) != self.group_size:
                raise InvalidError(f"multi processor: group {i} has {len(g)} slots, expected "
                                   f"{self.group_size}")
            flat += g
        return flat

    def _submit_groups(self, groups, blobs, keys, serialize: bool) -> int:
        groups, blobs = list(groups), list(blobs)
        flat, gs, n = self._flat(groups), self.group_size, len(groups)
        if n != len(blobs):
            raise InvalidError(f"processor: {n} groups but {len(blobs)} blobs")
        karr = _key_array(keys, n)
        if serialize:  # (p, src groups, n, group size, blobs, n, keys, &id)
            fn = lib.kvs_multi_processor_submit_serialize
            return self._submit_raw(lambda h, s, d, i: fn(h, s, n, gs, d, n, karr, i),
                                    flat, blobs)
        fn = lib.kvs_multi_processor_submit_deserialize  # (p, blobs, n, groups, n, gs, ...)
        return self._submit_raw(lambda h, s, d, i: fn(h, s, n, d, n, gs, karr, i), blobs, flat)

    def submit_serialize(self, src: Iterable[Sequence[Any]], dst: Iterable[Any],
                         keys: Optional[Iterable[Any]] = None) -> int:
        """Queue serialize of group src[i] into blob dst[i]; the task id."""
        return self._submit_groups(src, dst, keys, True)

    def submit_deserialize(self, src: Iterable[Any], dst: Iterable[Sequence[Any]],
                           keys: Optional[Iterable[Any]] = None) -> int:
        """Queue deserialize of blob src[i] into group dst[i]; the task id."""
        return self._submit_groups(dst, src, keys, False)

    def estimate(self, layouts: Sequence[Any]) -> int:
        """Blob size bound for a group of layouts (None for an absent slot)."""
        arr, k = _layout_ptrs(layouts)
        n = c_size_t()
        _check(lib.kvs_multi_processor_estimate_serialized_size(self._live(), arr, k, byref(n)))
        return n.value

    def set_split(self, min_bytes: int, chunk_bytes: int = 0) -> None:
        _check(lib.kvs_async_multi_processor_set_split(self._live(), min_bytes, chunk_bytes))


def _made(mos, objs) -> list:
    """The wrappers made at submit time (not the caller's own MemoryObjects): they let
    go of their exported buffers as soon as the result is read."""
    return [m for m, o in zip(mos, objs) if m is not o]


def create_processor(config: Config) -> Processor:
    """upstream create_serde_processor: the configured serde in a new async processor
    (a :class:`MultiProcessor` for multi-output types)."""
    return MultiProcessor(config) if _is_multi(config) else Processor(config)


# ---------------------------------------------------------------------------
# L2 adapters
# ---------------------------------------------------------------------------
@dataclass
class StoreResult:
    """A finished store task: ``task_id``, ``ok``, ``bytes_written``, ``status``, ``message``."""

    task_id: int
    ok: bool
    bytes_written: int
    status: int = 0
    message: str = ""


@dataclass
class BitmapResult:
    """A finished lookup-and-lock or load task: one bool per key (``hits``), the
    task's first error (``status``, ``message``; 0 / "" if none)."""

    hits: list
    status: int = 0
    message: str = ""

    @property
    def nhits(self) -> int:
        return sum(self.hits)

    def __iter__(self):
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)

    def __getitem__(self, i):
        return self.hits[i]


class L2Adapter(_Closable):
    """An L2 adapter (``fs``, ``memory``, ``redis``; with ``"serde"`` wrapped in the serde
    wrapper) created from a JSON spec: :meth:`create`.

    Three event fds (store, lookup, load); each finished task adds one count to its
    direction's fd. Objects given to store / load stay referenced until their result
    is read (or the adapter is closed).
    """

    _what = "L2 adapter"

    def __init__(self, spec: Config):
        h = c_void_p()
        _check(lib.kvs_l2_create(_config_text(spec), byref(h)))
        self._h = h.value
        self.spec = spec
        self._lock = threading.Lock()
        self._stores: dict = {}
        self._loads: dict = {}
        self._fds = (lib.kvs_l2_store_event_fd(self._h), lib.kvs_l2_lookup_event_fd(self._h),
                     lib.kvs_l2_load_event_fd(self._h))

    @classmethod
    def create(cls, spec: Config) -> "L2Adapter":
        """``L2Adapter.create({"type": "fs", "path": "/data/l2", "serde": {"type": "fp8"}})``"""
        return cls(spec)

    @property
    def store_event_fd(self) -> int:
        self._live()
        return self._fds[0]

    @property
    def lookup_event_fd(self) -> int:
        self._live()
        return self._fds[1]

    @property
    def load_event_fd(self) -> int:
        self._live()
        return self._fds[2]

    def _keys(self, keys):
        keys = list(keys)
        return _key_array(keys, len(keys)), len(keys)

    def _submit_objects(self, fn, keys, objects, writable: bool, table: dict) -> int:
        h = self._live()
        karr, n = self._keys(keys)
        objs = list(objects)
        if len(objs) != n:
            raise InvalidError(f"l2: {n} keys but {len(objs)} objects")
        mos = [_as_memobj(o, writable) for o in objs]
        tid = c_uint64()
        with self._lock:  # recorded before any other thread can pop the result
            _check(fn(h, karr, _memarray(mos), n, byref(tid)))
            table[tid.value] = (_made(mos, objs), mos)  # C reads them until then
        return tid.value

    def store(self, keys: Sequence[Any], objects: Sequence[Any]) -> int:
        """Queue a store of objects[i] (their used size) under keys[i]; the task id."""
        return self._submit_objects(lib.kvs_l2_submit_store, keys, objects, False,
                                    self._stores)

    def pop_completed_stores(self) -> list:
        """Every finished store task since the last call: a list of :class:`StoreResult`."""
        h = self._h
        if not h:
            return []
        out = []
        cap = 64
        buf = (F.kvs_l2_store_result * cap)()
        while True:
            cnt = c_size_t()
            _check(lib.kvs_l2_pop_completed_stores(h, buf, cap, byref(cnt)))
            for i in range(cnt.value):
                r = buf[i]
                with self._lock:
                    for m in self._stores.pop(r.id, ((), ()))[0]:
                        m.release()
                out.append(StoreResult(r.id, r.state == F.KVS_TASK_OK, r.bytes_written,
                                       r.status, r.message.decode("utf-8", "replace")))
            if cnt.value < cap:
                return out

    def lookup_and_lock(self, keys: Sequence[Any]) -> int:
        """Queue a lookup-and-lock of keys; the task id."""
        karr, n = self._keys(keys)
        tid = c_uint64()
        _check(lib.kvs_l2_submit_lookup_and_lock(self._live(), karr, n, byref(tid)))
        return tid.value

    def _bitmap(self, fn, tid) -> Optional[BitmapResult]:
        h = self._h
        if not h:
            return None
        b = F.kvs_l2_bitmap()
        _check(fn(h, tid, byref(b)))
        if b.state == F.KVS_TASK_PENDING:
            return None
        try:
            hits = [bool(b.hits[i]) for i in range(b.nkeys)] if b.nkeys else []
        finally:
            lib.kvs_l2_bitmap_release(byref(b))
        return BitmapResult(hits, b.status, b.message.decode("utf-8", "replace"))

    def query_lookup_and_lock(self, task_id: int) -> Optional[BitmapResult]:
        """The lookup's hits, once; None while pending."""
        return self._bitmap(lib.kvs_l2_query_lookup_and_lock, task_id)

    def unlock(self, keys: Sequence[Any]) -> None:
        """Release one lock on each key."""
        karr, n = self._keys(keys)
        _check(lib.kvs_l2_unlock(self._live(), karr, n))

    def load(self, keys: Sequence[Any], objects: Sequence[Any]) -> int:
        """Queue a load of keys[i] into objects[i] (writable tensors / buffers /
        MemoryObjects, whose used size becomes the stored size); the task id."""
        return self._submit_objects(lib.kvs_l2_submit_load, keys, objects, True,
                                    self._loads)

    def query_load(self, task_id: int) -> Optional[BitmapResult]:
        """The load's per-key hits, once; None while pending."""
        r = self._bitmap(lib.kvs_l2_query_load, task_id)
        if r is not None:
            with self._lock:
                for m in self._loads.pop(task_id, ((), ()))[0]:
                    m.release()
        return r

    def delete(self, keys: Sequence[Any]) -> list:
        """Delete keys now; one bool per key (False: absent or locked)."""
        karr, n = self._keys(keys)
        out = (c_uint8 * max(n, 1))()
        _check(lib.kvs_l2_delete(self._live(), karr, n, out))
        return [bool(out[i]) for i in range(n)]

    def object_sizes(self, keys: Sequence[Any]) -> list:
        """Stored size of each key in bytes, -1 if absent (advisory)."""
        karr, n = self._keys(keys)
        out = (c_int64 * max(n, 1))()
        _check(lib.kvs_l2_object_sizes(self._live(), karr, n, out))
        return [out[i] for i in range(n)]

    def usage(self) -> tuple:
        """(bytes used, capacity; 0 = unbounded)."""
        u = F.kvs_l2_usage()
        _check(lib.kvs_l2_get_usage(self._live(), byref(u)))
        return u.bytes_used, u.capacity

    def status(self) -> dict:
        """The adapter's state as a dict (always has "type" and "is_healthy")."""
        j = c_void_p()
        _check(lib.kvs_l2_status(self._live(), byref(j)))
        try:
            s = F.jansson.json_dumps(j, 0)
            try:
                return json.loads(ctypes.string_at(s).decode())
            finally:
                F.libc.free(s)
        finally:
            F.jansson.json_delete(j)  # a fresh object: we hold its only reference

    def close(self) -> None:
        """Finish or fail every task, release threads and fds, free (idempotent; GC)."""
        h = getattr(self, "_h", None)
        if h:
            self._h = None
            lib.kvs_l2_destroy(h)
            self._stores.clear()
            self._loads.clear()


def inspect_frame(blob: Any) -> dict:
    """What a pipeline frame's header says: version, keyed, key_fingerprint,
    header_bytes, payload_bytes, layout, stages [(name, params dict)]."""
    addr, n, _, _, keep = _b.resolve(blob, False, "inspect_frame")
    try:
        info = F.kvs_frame_info()
        _check(lib.kvs_frame_inspect(addr or None, n, byref(info)))
    finally:
        _b.release(keep)
    return {"version": info.version, "keyed": bool(info.keyed),
            "key_fingerprint": info.key_fingerprint, "header_bytes": info.header_bytes,
            "payload_bytes": info.payload_bytes, "format": info.format,
            "layout": Layout._from_c(info.layout),
            "stages": [(info.stages[i].name.decode(),
                        json.loads(info.stages[i].params.decode() or "{}"))
                       for i in range(info.nstages)]}
