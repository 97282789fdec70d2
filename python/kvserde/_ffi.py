"""The ctypes layer: finding libkvserde.so, mirrors of the C structs, prototypes.

Every struct here mirrors one in include/kvserde/*.h field for field (x86-64 /
aarch64 LP64 ABI); python/tests/test_abi.py checks the sizes and offsets against
values derived from the headers and round-trips each struct through the C
functions that fill it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int64, c_size_t,
                    c_uint, c_uint8, c_uint32, c_uint64, c_void_p)

# --- constants (include/kvserde/*.h) ---------------------------------------
KVS_MAX_DIMS = 8
KVS_MAX_GROUPS = 16
KVS_CHUNK_HASH_MAX = 128
KVS_MODEL_NAME_MAX = 255
KVS_CACHE_SALT_MAX = 128
KVS_ERROR_MSG_MAX = 512
KVS_FRAME_INFO_MAX_STAGES = 16

KVS_TASK_PENDING, KVS_TASK_OK, KVS_TASK_FAILED = 0, 1, 2
KVS_SERDE_SINGLE, KVS_SERDE_MULTI = 1, 2


class kvs_shape(Structure):
    _fields_ = [("ndim", c_uint32), ("dims", c_int64 * KVS_MAX_DIMS)]


class kvs_group(Structure):
    _fields_ = [("shape", kvs_shape), ("dtype", c_int)]


class kvs_layout(Structure):
    _fields_ = [("ngroups", c_uint32), ("groups", kvs_group * KVS_MAX_GROUPS)]


class kvs_memobj(Structure):
    _fields_ = [("data", c_void_p), ("capacity", c_size_t), ("used_size", c_size_t),
                ("layout", kvs_layout), ("format", c_int), ("owns_data", c_int)]


class kvs_object_key(Structure):
    _fields_ = [("chunk_hash", c_uint8 * KVS_CHUNK_HASH_MAX),
                ("chunk_hash_len", c_size_t),
                ("model_name", c_char * (KVS_MODEL_NAME_MAX + 1)),
                ("kv_rank", c_int64),
                ("object_group_id", c_int64),
                ("cache_salt", c_char * (KVS_CACHE_SALT_MAX + 1))]


class kvs_task_result(Structure):
    _fields_ = [("state", c_int), ("status", c_int), ("failed_index", c_size_t),
                ("message", c_char * KVS_ERROR_MSG_MAX)]


class kvs_l2_store_result(Structure):
    _fields_ = [("id", c_uint64), ("state", c_int), ("bytes_written", c_uint64),
                ("status", c_int), ("message", c_char * KVS_ERROR_MSG_MAX)]


class kvs_l2_bitmap(Structure):
    _fields_ = [("state", c_int), ("nkeys", c_size_t), ("hits", POINTER(c_uint8)),
                ("nhits", c_size_t), ("status", c_int),
                ("message", c_char * KVS_ERROR_MSG_MAX)]


class kvs_l2_usage(Structure):
    _fields_ = [("bytes_used", c_uint64), ("capacity", c_uint64)]


class kvs_serde_pair(Structure):
    _fields_ = [("serializer", c_void_p), ("deserializer", c_void_p),
                ("max_workers", c_uint)]


kvs_multi_serde_pair = kvs_serde_pair  # same three members, same order


class _frame_stage(Structure):
    _fields_ = [("name", c_char * 32), ("params", c_char * 192)]


class kvs_frame_info(Structure):
    _fields_ = [("version", c_uint), ("keyed", c_int), ("key_fingerprint", c_uint64),
                ("header_bytes", c_size_t), ("payload_bytes", c_uint64),
                ("format", c_int), ("layout", kvs_layout), ("nstages", c_uint32),
                ("stages", _frame_stage * KVS_FRAME_INFO_MAX_STAGES)]


# --- finding the library ----------------------------------------------------
def _candidates():
    env = os.environ.get("KVSERDE_LIBRARY")
    if env:
        yield env
        return  # an explicit choice is never silently replaced
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libkvserde.so", "libkvserde.so.0"):
        p = os.path.join(here, name)
        if os.path.exists(p):
            yield p
    found = ctypes.util.find_library("kvserde")
    if found:
        yield found
    yield "libkvserde.so"
    yield "libkvserde.so.0"


def _load():
    errors = []
    for cand in _candidates():
        try:
            return ctypes.CDLL(cand), cand
        except OSError as e:
            errors.append(f"{cand}: {e}")
    raise ImportError("kvserde: cannot load libkvserde.so (set KVSERDE_LIBRARY to its path, "
                      "or install the C library): " + "; ".join(errors))


lib, LIBRARY_PATH = _load()

P = c_void_p
PP = POINTER(c_void_p)
MEMP = POINTER(kvs_memobj)
MEMPP = POINTER(MEMP)
KEYP = POINTER(kvs_object_key)
LAYP = POINTER(kvs_layout)
TRP = POINTER(kvs_task_result)
U64P = POINTER(c_uint64)
SZP = POINTER(c_size_t)

_PROTOS = {
    "kvs_version": (c_char_p, []),
    "kvs_strerror": (c_char_p, [c_int]),
    "kvs_last_error": (c_char_p, []),
    "kvs_last_error_code": (c_int, []),
    "kvs_clear_error": (None, []),
    "kvs_dtype_name": (c_char_p, [c_int]),
    "kvs_dtype_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "kvs_dtype_size": (c_size_t, [c_int]),
    "kvs_layout_add_group": (c_int, [LAYP, c_uint32, POINTER(c_int64), c_int]),
    "kvs_layout_validate": (c_int, [LAYP]),
    "kvs_layout_nbytes": (c_uint64, [LAYP]),
    "kvs_layout_numel": (c_uint64, [LAYP]),
    "kvs_layout_group_offset": (c_uint64, [LAYP, c_uint32]),
    "kvs_layout_group_nbytes": (c_uint64, [LAYP, c_uint32]),
    "kvs_layout_equal": (c_int, [LAYP, LAYP]),
    "kvs_layout_format": (c_char_p, [LAYP, c_char_p, c_size_t]),
    "kvs_memobj_init": (c_int, [MEMP, c_void_p, c_size_t, LAYP, c_int]),
    "kvs_memobj_set_used_size": (c_int, [MEMP, c_size_t]),
    "kvs_memobj_size": (c_size_t, [MEMP]),
    "kvs_object_key_init": (c_int, [KEYP, c_void_p, c_size_t, c_char_p, c_int64, c_int64,
                                    c_char_p]),
    "kvs_object_key_validate": (c_int, [KEYP]),
    "kvs_object_key_equal": (c_int, [KEYP, KEYP]),
    "kvs_object_key_fingerprint": (c_uint64, [KEYP]),
    "kvs_make_temp_key": (c_int, [KEYP, KEYP]),
    "kvs_serialize": (c_int, [P, MEMP, MEMP, KEYP, SZP]),
    "kvs_estimate_serialized_size": (c_int, [P, LAYP, SZP]),
    "kvs_deserialize": (c_int, [P, MEMP, MEMP, KEYP]),
    "kvs_serde_create_pair": (c_int, [c_char_p, POINTER(kvs_serde_pair)]),
    "kvs_serde_pair_destroy": (None, [POINTER(kvs_serde_pair)]),
    "kvs_serde_types": (c_size_t, [POINTER(c_char_p), c_size_t]),
    "kvs_serde_type_kind": (c_int, [c_char_p, POINTER(c_int)]),
    "kvs_pipeline_stage_types": (c_size_t, [POINTER(c_char_p), c_size_t]),
    "kvs_l2_types": (c_size_t, [POINTER(c_char_p), c_size_t]),
    "kvs_fp8_isa": (c_char_p, []),
    "kvs_frame_detect": (c_int, [c_void_p, c_size_t]),
    "kvs_frame_inspect": (c_int, [c_void_p, c_size_t, POINTER(kvs_frame_info)]),
    "kvs_pipeline_verify": (c_int, [P, c_void_p, c_size_t, KEYP]),
    # multi
    "kvs_multi_serde_create_pair": (c_int, [c_char_p, POINTER(kvs_multi_serde_pair)]),
    "kvs_multi_serde_pair_destroy": (None, [POINTER(kvs_multi_serde_pair)]),
    "kvs_multi_serialize": (c_int, [P, MEMPP, c_size_t, MEMP, KEYP, SZP]),
    "kvs_multi_estimate_serialized_size": (c_int, [P, POINTER(LAYP), c_size_t, SZP]),
    "kvs_multi_deserialize": (c_int, [P, MEMP, MEMPP, c_size_t, KEYP]),
    "kvs_multi_serializer_group_size": (c_size_t, [P]),
    # processor
    "kvs_serde_create": (c_int, [c_char_p, PP]),
    "kvs_processor_serialize_event_fd": (c_int, [P]),
    "kvs_processor_deserialize_event_fd": (c_int, [P]),
    "kvs_processor_submit_serialize": (c_int, [P, MEMPP, c_size_t, MEMPP, c_size_t, KEYP,
                                               U64P]),
    "kvs_processor_submit_deserialize": (c_int, [P, MEMPP, c_size_t, MEMPP, c_size_t, KEYP,
                                                 U64P]),
    "kvs_processor_query_serialize_result": (c_int, [P, c_uint64, TRP]),
    "kvs_processor_query_deserialize_result": (c_int, [P, c_uint64, TRP]),
    "kvs_processor_estimate_serialized_size": (c_int, [P, LAYP, SZP]),
    "kvs_processor_close": (c_int, [P]),
    "kvs_processor_destroy": (None, [P]),
    "kvs_event_fd_consume": (c_int, [c_int, U64P]),
    "kvs_async_processor_set_split": (c_int, [P, c_size_t, c_size_t]),
    # multi processor
    "kvs_multi_serde_create": (c_int, [c_char_p, PP]),
    "kvs_multi_processor_group_size": (c_size_t, [P]),
    "kvs_multi_processor_serialize_event_fd": (c_int, [P]),
    "kvs_multi_processor_deserialize_event_fd": (c_int, [P]),
    "kvs_multi_processor_submit_serialize": (c_int, [P, MEMPP, c_size_t, c_size_t, MEMPP,
                                                     c_size_t, KEYP, U64P]),
    "kvs_multi_processor_submit_deserialize": (c_int, [P, MEMPP, c_size_t, MEMPP, c_size_t,
                                                       c_size_t, KEYP, U64P]),
    "kvs_multi_processor_query_serialize_result": (c_int, [P, c_uint64, TRP]),
    "kvs_multi_processor_query_deserialize_result": (c_int, [P, c_uint64, TRP]),
    "kvs_multi_processor_estimate_serialized_size": (c_int, [P, POINTER(LAYP), c_size_t,
                                                             SZP]),
    "kvs_multi_processor_close": (c_int, [P]),
    "kvs_multi_processor_destroy": (None, [P]),
    "kvs_async_multi_processor_set_split": (c_int, [P, c_size_t, c_size_t]),
    # L2
    "kvs_l2_create": (c_int, [c_char_p, PP]),
    "kvs_l2_store_event_fd": (c_int, [P]),
    "kvs_l2_lookup_event_fd": (c_int, [P]),
    "kvs_l2_load_event_fd": (c_int, [P]),
    "kvs_l2_submit_store": (c_int, [P, KEYP, MEMPP, c_size_t, U64P]),
    "kvs_l2_pop_completed_stores": (c_int, [P, POINTER(kvs_l2_store_result), c_size_t, SZP]),
    "kvs_l2_submit_lookup_and_lock": (c_int, [P, KEYP, c_size_t, U64P]),
    "kvs_l2_query_lookup_and_lock": (c_int, [P, c_uint64, POINTER(kvs_l2_bitmap)]),
    "kvs_l2_unlock": (c_int, [P, KEYP, c_size_t]),
    "kvs_l2_submit_load": (c_int, [P, KEYP, MEMPP, c_size_t, U64P]),
    "kvs_l2_query_load": (c_int, [P, c_uint64, POINTER(kvs_l2_bitmap)]),
    "kvs_l2_bitmap_release": (None, [POINTER(kvs_l2_bitmap)]),
    "kvs_l2_delete": (c_int, [P, KEYP, c_size_t, POINTER(c_uint8)]),
    "kvs_l2_object_sizes": (c_int, [P, KEYP, c_size_t, POINTER(c_int64)]),
    "kvs_l2_get_usage": (c_int, [P, POINTER(kvs_l2_usage)]),
    "kvs_l2_status": (c_int, [P, PP]),
    "kvs_l2_close": (c_int, [P]),
    "kvs_l2_destroy": (None, [P]),
}

for _name, (_res, _args) in _PROTOS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# jansson, for kvs_l2_status (already loaded as a dependency of libkvserde).
try:
    jansson = ctypes.CDLL("libjansson.so.4")
    jansson.json_dumps.restype = c_void_p
    jansson.json_dumps.argtypes = [c_void_p, c_size_t]
    jansson.json_delete.restype = None
    jansson.json_delete.argtypes = [c_void_p]
except OSError:  # pragma: no cover - libkvserde links it, so it is there
    jansson = None

libc = ctypes.CDLL(None)
libc.free.argtypes = [c_void_p]
libc.free.restype = None
