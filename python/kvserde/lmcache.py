"""kvserde as LMCache serdes: Serializer / Deserializer classes and ``register()``.

Turn it on by running, in the LMCache server process and before LMCache builds its
storage (``StorageManager``)::

    import kvserde.lmcache
    kvserde.lmcache.register()          # kvserde_fp8, kvserde_pipeline, ...

(in your launcher script, or in a ``sitecustomize.py`` on the server's ``PYTHONPATH``),
then name the type in the adapter's JSON::

    {"type": "fs", "base_path": "/data/l2",
     "serde": {"type": "kvserde_pipeline",
               "stages": [{"type": "fp8"}, {"type": "crc32c"}]}}

Every kwarg but ``type`` is passed to kvserde's own config (``max_workers`` included).

The classes work on LMCache ``MemoryObj``s through ``data_ptr``, ``get_size()``,
``get_shapes()`` and ``get_dtypes()`` (never ``.tensor``, which multi-group objects
lack), so no KV byte is copied in Python. They subclass LMCache's ABCs when ``lmcache``
is importable; without it they are plain classes with the same signatures.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import logging
import threading
from typing import Any, Callable, Optional, Sequence

from . import core
from .core import Layout, MemoryObject, ObjectKey, create_serde, serde_types
from .errors import InvalidError

log = logging.getLogger("kvserde.lmcache")

__all__ = ["KvserdeSerializer", "KvserdeDeserializer", "KvserdeMultiSerializer",
           "KvserdeMultiDeserializer", "KvserdeSerdeProcessor", "KvserdeMultiSerdeProcessor", "register", "lmcache_bases",
           "memobj"]


def lmcache_bases() -> Optional[dict]:
    """LMCache's serde ABCs and register_serde_factory, or None if lmcache is not
    importable."""
    try:
        from lmcache.v1.distributed.serde import base as _base  # type: ignore
        from lmcache.v1.distributed.serde import factory as _factory  # type: ignore
    except Exception:  # ImportError, or a broken install
        return None
    out = {"Serializer": _base.Serializer, "Deserializer": _base.Deserializer,
           "SerdeProcessor": _base.SerdeProcessor,
           "register_serde_factory": _factory.register_serde_factory}
    try:
        from lmcache.v1.distributed.serde import multi as _multi  # type: ignore
        out["MultiSerializer"] = _multi.MultiSerializer
        out["MultiDeserializer"] = _multi.MultiDeserializer
    except Exception:
        pass
    return out


def _data_ptr(obj) -> int:
    p = obj.data_ptr
    return p() if callable(p) else p


def memobj(obj: Any, *, blob: bool = False) -> MemoryObject:
    """A kvserde MemoryObject over an LMCache MemoryObj (no copy).

    ``blob=True``: the object holds serialized bytes: a flat uint8 layout of its
    get_size() bytes. Otherwise its layout comes from get_shapes() / get_dtypes().
    Tensors, arrays and buffers are accepted too (as in the core API).
    """
    if isinstance(obj, MemoryObject):
        return obj
    if not hasattr(obj, "get_size") or not hasattr(obj, "data_ptr"):
        return core._as_memobj(obj, True)
    size = int(obj.get_size())
    lay = Layout.flat(size) if blob else Layout(obj.get_shapes(), obj.get_dtypes())
    if lay.nbytes > size:
        raise InvalidError(f"lmcache: MemoryObj holds {size} bytes, its layout {lay} needs "
                           f"{lay.nbytes}")
    return MemoryObject.from_address(_data_ptr(obj), size, lay,
                                     core.FMT_BINARY_BUFFER if blob else core.FMT_UNDEFINED,
                                     keepalive=obj)


def stored_blob(obj: Any, dst_layouts: Sequence[Optional[Layout]]) -> MemoryObject:
    """The serialized bytes of LMCache MemoryObj ``obj``, without padding.

    LMCache may hand a deserializer a temp buffer sized from the estimate, with the
    stored bytes at its start ("src may be padded larger than the stored frame"; the
    length comes from dst or the serde's own header). kvserde's serdes refuse a blob
    whose size is not the stored object's (a truncated or foreign object must not load
    silently), so the padding is cut here, where LMCache's contract applies: a frame
    (KVSF) or a kv_split blob (KVSP) by the length its header records, a plain fp8 blob
    by the destination's element count. Nothing is cut when the recorded length does
    not fit, so the serde's own checks still see a damaged blob whole.
    """
    if isinstance(obj, MemoryObject) or not hasattr(obj, "get_size"):
        return memobj(obj, blob=True)
    size = int(obj.get_size())
    addr = _data_ptr(obj)
    head = ctypes.string_at(addr, min(size, 16)) if size else b""
    n = size
    if len(head) == 16 and head[:4] == b"KVSF":
        n = int.from_bytes(head[6:8], "little") + int.from_bytes(head[8:16], "little")
    elif len(head) == 16 and head[:4] == b"KVSP":
        n = int.from_bytes(head[8:16], "little")
    elif len(dst_layouts) == 1 and dst_layouts[0] is not None:
        n = dst_layouts[0].numel  # plain fp8: one code per element
    if n > size:
        n = size
    return MemoryObject.from_address(addr, size, Layout.flat(n), core.FMT_BINARY_BUFFER,
                                     keepalive=obj, used_size=n)


def _layout_desc(layout_desc) -> Layout:
    return Layout.of(layout_desc)


class _Base:
    def __init__(self, config: Any = None, *, serde: Any = None):
        if serde is None:
            serde = create_serde(config if config is not None else {"type": "fp8"})
        self._serde = serde
        cfg = json.loads(config) if isinstance(config, str) else config
        # plain fp8 blobs carry no length: padding is cut by the destination's size
        self._plain_fp8 = serde is not None and isinstance(cfg, dict) and \
            cfg.get("type", "fp8") == "fp8" or config is None

    def close(self) -> None:
        self._serde.close()


class KvserdeSerializer(_Base):
    """LMCache ``Serializer`` backed by a kvserde serde (``config``: its JSON/dict)."""

    def serialize(self, src: Any, dst: Any, key: Any = None) -> int:
        """Serialize MemoryObj ``src`` into MemoryObj ``dst``; the exact bytes written.
        ``key`` (LMCache ObjectKey or None; may be omitted: the older key-less form)."""
        return self._serde.serialize(memobj(src), memobj(dst, blob=True), ObjectKey.of(key))

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        """Upper bound for an object of ``layout_desc`` (MemoryLayoutDesc: shapes,
        dtypes)."""
        return self._serde.estimate(_layout_desc(layout_desc))


class KvserdeDeserializer(_Base):
    """LMCache ``Deserializer`` backed by a kvserde serde."""

    def deserialize(self, src: Any, dst: Any, key: Any = None) -> None:
        """Decode MemoryObj ``src`` (its stored bytes: padding after them is cut, see
        stored_blob) into ``dst``."""
        d = memobj(dst)
        blob = stored_blob(src, [d.layout]) if self._plain_fp8 else stored_blob(src, [])
        self._serde.deserialize(blob, d, ObjectKey.of(key))


class KvserdeMultiSerializer(_Base):
    """LMCache ``MultiSerializer`` backed by a kvserde multi-output serde (kv_split)."""

    def __init__(self, config: Any = None, *, serde: Any = None):
        super().__init__(config if config is not None else {"type": "kv_split"},
                         serde=serde)

    @property
    def group_size(self) -> int:
        return self._serde.group_size

    def serialize(self, src: Sequence[Any], dst: Any, key: Any = None) -> int:
        group = [None if o is None else memobj(o) for o in src]
        return self._serde.serialize(group, memobj(dst, blob=True), ObjectKey.of(key))

    def estimate_serialized_size(self, layout_descs: Sequence[Any]) -> int:
        return self._serde.estimate([None if d is None else _layout_desc(d)
                                     for d in layout_descs])


class KvserdeMultiDeserializer(KvserdeMultiSerializer):
    """LMCache ``MultiDeserializer`` backed by a kvserde multi-output serde."""

    def deserialize(self, src: Any, dst: Sequence[Any], key: Any = None) -> None:
        group = [None if o is None else memobj(o) for o in dst]
        self._serde.deserialize(stored_blob(src, []), group, ObjectKey.of(key))


class KvserdeSerdeProcessor:
    """LMCache ``SerdeProcessor`` backed by kvserde's C async processor.

    Two distinct event fds, one count per finished batch; query results are popped
    once (``True`` / ``False``, then ``None``); after a successful serialize every
    destination's ``set_used_size(n)`` is called with the bytes written, as LMCache's
    AsyncSerdeProcessor does (also for the objects before a failing one).
    """

    _processor = core.Processor

    def __init__(self, config: Any):
        self._p = type(self)._processor(config)
        self._lock = threading.Lock()
        self._dst: dict = {}

    def _src(self, objs):
        return [memobj(o) for o in objs]

    _dst_objs = _src

    def get_serialize_event_fd(self) -> int:
        return self._p.serialize_event_fd

    def get_deserialize_event_fd(self) -> int:
        return self._p.deserialize_event_fd

    def submit_serialize(self, src_objs: Sequence[Any], dst_objs: Sequence[Any],
                         keys: Optional[Sequence[Any]] = None) -> int:
        src = self._src(src_objs)
        dst = [memobj(o, blob=True) for o in dst_objs]
        with self._lock:  # the core processor keeps src / dst alive until the pop
            tid = self._p.submit_serialize(src, dst, keys)
            self._dst[tid] = list(dst_objs)
        return tid

    def submit_deserialize(self, src_objs: Sequence[Any], dst_objs: Sequence[Any],
                           keys: Optional[Sequence[Any]] = None) -> int:
        src = [memobj(o, blob=True) for o in src_objs]
        return self._p.submit_deserialize(src, self._dst_objs(dst_objs), keys)

    def _popped(self, r, task_id: int, what: str) -> Optional[bool]:
        if r is None:
            return None
        if not r.ok:
            log.error("kvserde %s task %d failed: %s", what, task_id, r.message)
        return r.ok

    def query_serialize_result(self, task_id: int) -> Optional[bool]:
        r = self._p.query_serialize_result(task_id)
        if r is not None:
            with self._lock:
                objs = self._dst.pop(task_id, [])
            done = len(objs) if r.ok else r.failed_index  # those before a failure too
            for obj, n in list(zip(objs, r.used_sizes))[:done]:
                if hasattr(obj, "set_used_size"):
                    obj.set_used_size(n)
        return self._popped(r, task_id, "serialize")

    def query_deserialize_result(self, task_id: int) -> Optional[bool]:
        return self._popped(self._p.query_deserialize_result(task_id), task_id,
                            "deserialize")

    def estimate_serialized_size(self, layout_desc: Any) -> int:
        return self._p.estimate(_layout_desc(layout_desc))

    def close(self) -> None:
        self._p.close()
        with self._lock:
            self._dst.clear()


class KvserdeMultiSerdeProcessor(KvserdeSerdeProcessor):
    """The same SerdeProcessor shape for a multi-output serde (kv_split), backed by
    kvserde's C multi processor: each source of submit_serialize (and each destination
    of submit_deserialize) is a tuple of ``group_size`` MemoryObjs, None for an absent
    slot; ``estimate_serialized_size`` takes a tuple of layout descs."""

    _processor = core.MultiProcessor

    @property
    def group_size(self) -> int:
        return self._p.group_size

    def _src(self, groups):
        return [[None if o is None else memobj(o) for o in g] for g in groups]

    _dst_objs = _src

    def estimate_serialized_size(self, layout_descs: Any) -> int:
        return self._p.estimate([None if d is None else _layout_desc(d)
                                 for d in layout_descs])


_SUBCLASSES: dict = {}


def _bind(cls, base_name: str, bases: Optional[dict]):
    """cls, or (with lmcache importable) a subclass of cls and LMCache's ABC."""
    if not bases or base_name not in bases:
        return cls
    k = (cls, bases[base_name])
    if k not in _SUBCLASSES:
        _SUBCLASSES[k] = type(cls.__name__, (cls, bases[base_name]),
                              {"__module__": __name__, "__doc__": cls.__doc__})
    return _SUBCLASSES[k]


def register(prefix: str = "kvserde_",
             register_fn: Optional[Callable[..., None]] = None) -> list:
    """Register every kvserde serde type with LMCache as ``prefix + name``.

    Uses ``lmcache.v1.distributed.serde.factory.register_serde_factory`` (or
    ``register_fn``, e.g. a test stand-in). Each factory gets LMCache's kwargs dict
    (every key but "type") and returns a :class:`KvserdeSerdeProcessor` (subclassing
    LMCache's SerdeProcessor when importable); a multi-output type (kv_split) gets a
    :class:`KvserdeMultiSerdeProcessor` (groups of MemoryObjs per item).
    Names already registered are skipped, so calling it twice is harmless. Returns
    the names registered by this call. Raises RuntimeError when LMCache is not
    importable and no register_fn is given.
    """
    bases = lmcache_bases()
    if register_fn is None:
        if bases is None:
            raise RuntimeError(
                "kvserde.lmcache.register(): the lmcache package is not importable in "
                "this Python; install LMCache (or pass register_fn=) before registering "
                "kvserde serdes")
        register_fn = bases["register_serde_factory"]
    try:
        params = inspect.signature(register_fn).parameters
    except (TypeError, ValueError):
        params = {}
    done = []
    for name, kind in serde_types().items():
        full = prefix + name
        factory = _factory(name, bases, kind == "multi")
        extra = {}
        if "size_contract" in params:
            extra = _size_contract(name)
        try:
            register_fn(full, factory, **extra)
        except ValueError as e:
            if "already registered" in str(e):
                continue
            raise
        done.append(full)
    return done


def _size_contract(name: str) -> dict:
    try:
        from lmcache.v1.distributed.serde.factory import SerdeSizeContract  # type: ignore
    except Exception:
        return {}
    exact = name in ("fp8", "pipeline")  # both write exactly their frame / elements
    return {"size_contract": SerdeSizeContract.EXACT if exact else
            SerdeSizeContract.UPPER_BOUND}


def _factory(name: str, bases, multi: bool):
    cls = _bind(KvserdeMultiSerdeProcessor if multi else KvserdeSerdeProcessor,
                "SerdeProcessor", bases)

    def factory(kwargs: Optional[dict] = None):
        cfg = dict(kwargs or {})
        cfg.pop("type", None)  # the oldest LMCache passed the whole dict
        cfg["type"] = name
        return cls(cfg)

    factory.__name__ = f"create_kvserde_{name}"
    return factory


def serializer(config: Any) -> KvserdeSerializer:
    """A Serializer (LMCache's ABC when importable) for a kvserde config."""
    return _bind(KvserdeSerializer, "Serializer", lmcache_bases())(config)


def deserializer(config: Any) -> KvserdeDeserializer:
    """A Deserializer (LMCache's ABC when importable) for a kvserde config."""
    return _bind(KvserdeDeserializer, "Deserializer", lmcache_bases())(config)
