"""kvserde: serialize LLM KV-cache tensors on their way to storage (Python binding).

Pure Python over libkvserde.so through ctypes: no compiler needed, no copy of KV data
(tensors and buffers are passed to C by address), the GIL released during every C
call. The library is looked up in ``$KVSERDE_LIBRARY``, then next to this package,
then on the dynamic linker's search path.

    import torch, kvserde
    serde = kvserde.create_serde({"type": "fp8"})
    kv = torch.randn(2, 32, 256, 1024).to(torch.bfloat16)
    blob = serde.serialize(kv)                      # a bytearray of kv.numel() bytes
    back = torch.empty_like(kv)
    serde.deserialize(blob, back)

See docs/python.md for the full API and the LMCache plug-in (kvserde.lmcache).
"""

from ._ffi import LIBRARY_PATH
from .core import (DTYPES, BitmapResult, L2Adapter, Layout, MemoryObject, MultiProcessor,
                   MultiSerde,
                   ObjectKey, Processor, Serde, StoreResult, TaskResult, consume_event_fd,
                   create_processor, create_serde, fp8_isa, inspect_frame, l2_types,
                   pipeline_stage_types, serde_types, strerror, version)
from .errors import (AuthError, ClosedError, CorruptError, Error, ExistsError, InvalidError,
                     IOError, KeyMismatchError, NoMemoryError, NoSpaceError, NotFoundError,
                     UnsupportedError, error_for)

__version__ = "0.1.0"

__all__ = [
    "LIBRARY_PATH", "DTYPES", "BitmapResult", "L2Adapter", "Layout", "MemoryObject",
    "MultiProcessor", "MultiSerde", "ObjectKey", "Processor", "Serde", "StoreResult", "TaskResult",
    "consume_event_fd", "create_processor", "create_serde", "fp8_isa", "inspect_frame",
    "l2_types", "pipeline_stage_types", "serde_types", "strerror", "version",
    "AuthError", "ClosedError", "CorruptError", "Error", "ExistsError", "InvalidError",
    "IOError", "KeyMismatchError", "NoMemoryError", "NoSpaceError", "NotFoundError",
    "UnsupportedError", "error_for",
]
