"""The ctypes mirrors of the C structs, checked two ways: sizes and offsets against
values derived by hand from include/kvserde/*.h (LP64: size_t, pointers and int64_t
are 8 bytes and 8-aligned, enums and int 4 bytes), and round trips through the C
functions that fill or read each struct."""

import ctypes

import pytest

import kvserde
from kvserde import _ffi as F
from kvserde.core import lib

# (struct, sizeof, {field: offset}) derived from the headers:
#   kvs_shape   {uint32 ndim; int64 dims[8]}                  4 + 4 pad + 64 = 72
#   kvs_group   {kvs_shape shape; kvs_dtype dtype}            72 + 4 + 4 pad = 80
#   kvs_layout  {uint32 ngroups; kvs_group groups[16]}        8 + 16 * 80 = 1288
#   kvs_memobj  {void*; size_t; size_t; kvs_layout; enum; int} 24 + 1288 + 4 + 4 = 1320
#   kvs_object_key {u8[128]; size_t; char[256]; i64; i64; char[129]} 537 -> 544
#   kvs_task_result {enum; int; size_t; char[512]}            16 + 512 = 528
#   kvs_l2_store_result {u64; enum; u64; int; char[512]}      28 + 512 = 540 -> 544
#   kvs_l2_bitmap {enum; size_t; u8*; size_t; int; char[512]} 36 + 512 = 548 -> 552
#   kvs_serde_pair {ptr; ptr; unsigned}                       20 -> 24
#   kvs_frame_info {unsigned; int; u64; size_t; u64; enum; kvs_layout; u32;
#                   {char[32]; char[192]}[16]}                1332 + 3584 = 4916 -> 4920
EXPECTED = [
    (F.kvs_shape, 72, {"ndim": 0, "dims": 8}),
    (F.kvs_group, 80, {"shape": 0, "dtype": 72}),
    (F.kvs_layout, 1288, {"ngroups": 0, "groups": 8}),
    (F.kvs_memobj, 1320, {"data": 0, "capacity": 8, "used_size": 16, "layout": 24,
                          "format": 1312, "owns_data": 1316}),
    (F.kvs_object_key, 544, {"chunk_hash": 0, "chunk_hash_len": 128, "model_name": 136,
                             "kv_rank": 392, "object_group_id": 400, "cache_salt": 408}),
    (F.kvs_task_result, 528, {"state": 0, "status": 4, "failed_index": 8, "message": 16}),
    (F.kvs_l2_store_result, 544, {"id": 0, "state": 8, "bytes_written": 16, "status": 24,
                                  "message": 28}),
    (F.kvs_l2_bitmap, 552, {"state": 0, "nkeys": 8, "hits": 16, "nhits": 24, "status": 32,
                            "message": 36}),
    (F.kvs_l2_usage, 16, {"bytes_used": 0, "capacity": 8}),
    (F.kvs_serde_pair, 24, {"serializer": 0, "deserializer": 8, "max_workers": 16}),
    (F.kvs_frame_info, 4920, {"version": 0, "keyed": 4, "key_fingerprint": 8,
                              "header_bytes": 16, "payload_bytes": 24, "format": 32,
                              "layout": 40, "nstages": 1328, "stages": 1332}),
]


@pytest.mark.parametrize("cls,size,offsets", EXPECTED, ids=lambda x: getattr(x, "__name__", ""))
def test_struct_size_and_offsets(cls, size, offsets):
    assert ctypes.sizeof(cls) == size
    for name, off in offsets.items():
        assert getattr(cls, name).offset == off, name


def test_layout_roundtrip_through_c():
    lay = kvserde.Layout([(2, 4, 16, 64), (16,), ()], ["bfloat16", "float16", "float32"])
    # filled by kvs_layout_add_group; read back field by field from the mirror
    c = lay._c
    assert c.ngroups == 3
    assert c.groups[0].shape.ndim == 4 and list(c.groups[0].shape.dims[:4]) == [2, 4, 16, 64]
    assert c.groups[1].dtype == kvserde.DTYPES["float16"]
    assert c.groups[2].shape.ndim == 0
    # and the C readers agree with what Python put / expects
    assert lay.nbytes == 2 * 4 * 16 * 64 * 2 + 16 * 2 + 4
    assert lay.group_offset(1) == 2 * 4 * 16 * 64 * 2
    assert lay.group_offset(2) == lay.group_offset(1) + 32
    assert str(lay) == "[2x4x16x64 bfloat16, 16 float16, scalar float32]" or "2x4x16x64" in str(lay)
    # a layout built in Python field by field is read correctly by C
    c2 = F.kvs_layout()
    c2.ngroups = 1
    c2.groups[0].shape.ndim = 2
    c2.groups[0].shape.dims[0], c2.groups[0].shape.dims[1] = 3, 5
    c2.groups[0].dtype = kvserde.DTYPES["float32"]
    assert lib.kvs_layout_validate(ctypes.byref(c2)) == 0
    assert lib.kvs_layout_nbytes(ctypes.byref(c2)) == 60
    buf = ctypes.create_string_buffer(64)
    assert b"3x5" in lib.kvs_layout_format(ctypes.byref(c2), buf, 64)


def test_memobj_roundtrip_through_c():
    buf = bytearray(4096)
    mo = kvserde.MemoryObject(buf, kvserde.Layout([(1024,)], ["float32"]), 1)
    c = mo._c  # filled by kvs_memobj_init
    addr = ctypes.addressof((ctypes.c_char * 4096).from_buffer(buf))
    assert c.data == addr and c.capacity == 4096 and c.used_size == 4096
    assert c.format == 1 and c.owns_data == 0 and c.layout.ngroups == 1
    mo.set_used_size(100)
    assert lib.kvs_memobj_size(ctypes.byref(c)) == 100 == c.used_size


def test_object_key_roundtrip_through_c():
    k = kvserde.ObjectKey(b"\x00\x01\x02", "meta-llama/Llama-3-8B", kv_rank=3,
                          object_group_id=7, cache_salt="tenant")
    c = k._c  # filled by kvs_object_key_init
    assert bytes(c.chunk_hash[:c.chunk_hash_len]) == b"\x00\x01\x02"
    assert c.model_name == b"meta-llama/Llama-3-8B"
    assert (c.kv_rank, c.object_group_id, c.cache_salt) == (3, 7, b"tenant")
    # one built field by field in Python validates and compares equal in C
    c2 = F.kvs_object_key()
    c2.chunk_hash[:3] = [0, 1, 2]
    c2.chunk_hash_len = 3
    c2.model_name = b"meta-llama/Llama-3-8B"
    c2.kv_rank, c2.object_group_id, c2.cache_salt = 3, 7, b"tenant"
    assert lib.kvs_object_key_validate(ctypes.byref(c2)) == 0
    assert lib.kvs_object_key_equal(ctypes.byref(c), ctypes.byref(c2)) == 1


def test_task_result_and_frame_info_filled_by_c():
    proc = kvserde.Processor({"type": "fp8"})
    src = bytearray(64)
    lay = kvserde.Layout([(32,)], ["bfloat16"])
    tid = proc.submit_serialize([kvserde.MemoryObject(src, lay)], [bytearray(4)])
    r = None
    while r is None:
        r = proc.query_serialize_result(tid)
    assert not r.ok and r.status == kvserde.NoSpaceError.code and r.failed_index == 0
    assert r.message.startswith("processor: serialize object 0 of 1 failed")
    proc.close()
    s = kvserde.create_serde({"type": "pipeline", "stages": [{"type": "fp8"}]})
    kv = bytearray(2 * 64)
    blob = s.serialize(kv, layout=kvserde.Layout([(2, 32)], ["bfloat16"]),
                       key=kvserde.ObjectKey(b"k", "m"))
    info = kvserde.inspect_frame(blob)
    assert info["layout"] == kvserde.Layout([(2, 32)], ["bfloat16"])
    assert info["keyed"] and info["key_fingerprint"] == kvserde.ObjectKey(b"k", "m").fingerprint
    assert [n for n, _ in info["stages"]] == ["fp8", "crc32c"]
    assert info["header_bytes"] + info["payload_bytes"] == len(blob)
    assert info["payload_bytes"] == 64 + 4


def test_l2_results_filled_by_c():
    with kvserde.L2Adapter.create({"type": "memory"}) as a:
        k = [kvserde.ObjectKey(bytes([i]), "m") for i in range(3)]
        tid = a.store(k[:2], [bytearray(b"x" * 10), bytearray(b"y" * 20)])
        done = []
        while not done:
            done = a.pop_completed_stores()
        assert done[0].task_id == tid and done[0].ok and done[0].bytes_written == 30
        lid = a.lookup_and_lock(k)
        r = None
        while r is None:
            r = a.query_lookup_and_lock(lid)
        assert r.hits == [True, True, False] and r.nhits == 2 and r.status == 0
        assert a.usage() == (30, 0)
        assert a.object_sizes(k) == [10, 20, -1]
