"""The LMCache plug-in against stand-ins written from LMCache's documented interface
(MemoryObj accessors, MemoryLayoutDesc(shapes, dtypes), ObjectKey fields,
register_serde_factory(name, factory)), and against the real lmcache when installed."""

import importlib.util
import selectors
from dataclasses import dataclass

import pytest

import kvserde
from kvserde import lmcache as klm

torch = pytest.importorskip("torch")


@dataclass(frozen=True)
class MemoryLayoutDesc:
    shapes: list
    dtypes: list


@dataclass(frozen=True)
class ObjectKey:
    chunk_hash: bytes
    model_name: str
    kv_rank: int = 0


class MemoryObj:
    """A TensorMemoryObj stand-in: groups packed in one uint8 buffer; set_used_size
    narrows get_size(); no .tensor for multi-group objects."""

    def __init__(self, shapes, dtypes, nbytes=None):
        self.shapes, self.dtypes = [torch.Size(s) for s in shapes], list(dtypes)
        sizes = [int(torch.Size(s).numel()) * torch.empty(0, dtype=d).element_size()
                 for s, d in zip(shapes, dtypes)]
        self.phy = nbytes if nbytes is not None else sum(sizes)
        self.raw_data = torch.zeros(self.phy, dtype=torch.uint8)
        self._sizes = sizes
        self._used = None

    @property
    def data_ptr(self):
        return self.raw_data.data_ptr()

    def get_size(self):
        return self._used if self._used is not None else sum(self._sizes)

    def get_shapes(self):
        return self.shapes

    def get_dtypes(self):
        return self.dtypes

    def set_used_size(self, n):
        if not 0 <= n <= self.phy:
            raise ValueError(f"set_used_size: n={n} out of range [0, {self.phy}]")
        self._used = n

    def get_tensor(self, i):
        off = sum(self._sizes[:i])
        return self.raw_data[off:off + self._sizes[i]].view(self.dtypes[i]).view(self.shapes[i])

    @property
    def tensor(self):
        if len(self.shapes) != 1:
            raise AssertionError("multi-group MemoryObj has no .tensor (LMCache #4972)")
        return self.get_tensor(0)


def blob_obj(nbytes):
    return MemoryObj([(nbytes,)], [torch.uint8])


def kv_obj():
    o = MemoryObj([(2, 4, 16, 64), (16, 64)], [torch.bfloat16, torch.float16])
    o.get_tensor(0).copy_((torch.arange(8192) % 64 / 32 + 1).reshape(2, 4, 16, 64))
    o.get_tensor(1).copy_(torch.arange(1024).reshape(16, 64) / 512)
    return o


KEY = ObjectKey(b"\x00\x01", "meta-llama/Llama-3-8B")


def test_sync_serializer_multi_group_exact_count_and_key():
    cfg = {"type": "pipeline", "stages": [{"type": "fp8"}, {"type": "crc32c"}]}
    ser, de = klm.serializer(cfg), klm.deserializer(cfg)
    src = kv_obj()
    est = ser.estimate_serialized_size(MemoryLayoutDesc(src.get_shapes(), src.get_dtypes()))
    dst = blob_obj(est)
    n = ser.serialize(src, dst, KEY)
    assert 0 < n <= est
    dst.set_used_size(n)  # what AsyncSerdeProcessor does with the count
    back = MemoryObj(src.get_shapes(), src.get_dtypes())
    de.deserialize(dst, back, KEY)
    for i in range(2):
        assert torch.allclose(back.get_tensor(i).float(), src.get_tensor(i).float(),
                              rtol=0.07, atol=1e-3)
    with pytest.raises(kvserde.KeyMismatchError):
        de.deserialize(dst, back, ObjectKey(b"\x09", "meta-llama/Llama-3-8B"))
    # the older key-less form
    fp8 = klm.serializer({"type": "fp8"})
    d2 = blob_obj(fp8.estimate_serialized_size(MemoryLayoutDesc(src.shapes, src.dtypes)))
    assert fp8.serialize(src, d2) == 8192 + 1024
    # d2 is still the whole estimate (1.5x the codes): LMCache may pass such a padded
    # buffer; the plug-in cuts it to the destination's element count
    assert d2.get_size() > 8192 + 1024
    klm.deserializer({"type": "fp8"}).deserialize(d2, back)
    for i in range(2):
        assert torch.allclose(back.get_tensor(i).float(), src.get_tensor(i).float(),
                              rtol=0.07, atol=1e-3)
    # a padded frame: cut to the length its header records
    pad = blob_obj(est + 100)
    ser.serialize(src, pad, KEY)
    de.deserialize(pad, back, KEY)


def test_multi_serializer_kv_split():
    ms, md = klm.KvserdeMultiSerializer({"type": "kv_split"}), \
        klm.KvserdeMultiDeserializer({"type": "kv_split"})
    k, v = MemoryObj([(4, 64)], [torch.bfloat16]), MemoryObj([(4, 64)], [torch.bfloat16])
    k.get_tensor(0).fill_(1.5)
    v.get_tensor(0).fill_(0.25)
    assert ms.group_size == 2
    dst = blob_obj(ms.estimate_serialized_size([MemoryLayoutDesc(k.shapes, k.dtypes)] * 2))
    n = ms.serialize((k, v), dst, KEY)
    dst.set_used_size(n)
    k2, v2 = MemoryObj([(4, 64)], [torch.bfloat16]), MemoryObj([(4, 64)], [torch.bfloat16])
    md.deserialize(dst, (k2, v2), KEY)
    assert torch.equal(k2.get_tensor(0), k.get_tensor(0))
    assert torch.equal(v2.get_tensor(0), v.get_tensor(0))


def test_register_with_stand_in_and_processor_shape():
    registry = {}

    def register_serde_factory(name, factory):
        if name in registry:
            raise ValueError(f"Serde type already registered: {name!r}")
        registry[name] = factory

    names = klm.register(register_fn=register_serde_factory)
    assert "kvserde_fp8" in names and "kvserde_pipeline" in names
    assert klm.register(register_fn=register_serde_factory) == []  # idempotent
    # what LMCache's StorageManager does with the JSON's serde dict
    proc = registry["kvserde_pipeline"]({"stages": [{"type": "fp8"}], "max_workers": 2})
    sfd, dfd = proc.get_serialize_event_fd(), proc.get_deserialize_event_fd()
    assert sfd != dfd
    srcs = [kv_obj(), kv_obj()]
    est = proc.estimate_serialized_size(MemoryLayoutDesc(srcs[0].shapes, srcs[0].dtypes))
    dsts = [blob_obj(est), blob_obj(est)]
    tid = proc.submit_serialize(srcs, dsts, [KEY, KEY])
    sel = selectors.DefaultSelector()
    sel.register(sfd, selectors.EVENT_READ)
    assert sel.select(20)
    assert proc.query_serialize_result(tid) is True
    assert proc.query_serialize_result(tid) is None
    assert all(0 < d.get_size() <= est for d in dsts)  # set_used_size(n) was called
    backs = [MemoryObj(s.shapes, s.dtypes) for s in srcs]
    tid2 = proc.submit_deserialize(dsts, backs, [KEY, KEY])
    sel.unregister(sfd)
    sel.register(dfd, selectors.EVENT_READ)
    assert sel.select(20)
    assert kvserde.consume_event_fd(dfd) == 1
    assert proc.query_deserialize_result(tid2) is True
    assert torch.allclose(backs[1].get_tensor(0).float(), srcs[1].get_tensor(0).float(),
                          rtol=0.07)
    tid3 = proc.submit_deserialize(dsts, backs, [ObjectKey(b"x", "m")] * 2)
    assert sel.select(20)
    assert kvserde.consume_event_fd(dfd) == 1
    assert proc.query_deserialize_result(tid3) is False
    sel.close()
    proc.close()
    # the multi-output type: groups of MemoryObjs per item
    assert "kvserde_kv_split" in names
    mp = registry["kvserde_kv_split"]({"v_dtype": "float8_e5m2"})
    k, v = MemoryObj([(4, 64)], [torch.bfloat16]), MemoryObj([(4, 64)], [torch.bfloat16])
    k.get_tensor(0).fill_(1.5)
    v.get_tensor(0).fill_(0.5)
    desc = MemoryLayoutDesc(k.shapes, k.dtypes)
    blob = blob_obj(mp.estimate_serialized_size((desc, desc)))
    tid = mp.submit_serialize([(k, v)], [blob], [KEY])
    sel = selectors.DefaultSelector()
    sel.register(mp.get_serialize_event_fd(), selectors.EVENT_READ)
    assert sel.select(20)
    assert mp.query_serialize_result(tid) is True
    assert blob._used is not None and 0 < blob.get_size() <= blob.phy  # set_used_size(n)
    k2, v2 = MemoryObj([(4, 64)], [torch.bfloat16]), MemoryObj([(4, 64)], [torch.bfloat16])
    tid = mp.submit_deserialize([blob], [(k2, v2)], [KEY])
    sel.unregister(mp.get_serialize_event_fd())
    sel.register(mp.get_deserialize_event_fd(), selectors.EVENT_READ)
    assert sel.select(20)
    assert mp.query_deserialize_result(tid) is True
    assert torch.equal(k2.get_tensor(0), k.get_tensor(0))
    assert torch.equal(v2.get_tensor(0), v.get_tensor(0))
    sel.close()
    mp.close()


def test_register_without_lmcache_refuses_clearly():
    if importlib.util.find_spec("lmcache") is not None:
        pytest.skip("lmcache is installed")
    with pytest.raises(RuntimeError, match="lmcache package is not importable"):
        klm.register()


@pytest.mark.skipif(importlib.util.find_spec("lmcache") is None,
                    reason="the real lmcache package is not installed")
def test_real_lmcache():  # pragma: no cover - needs lmcache
    from lmcache.v1.distributed.serde import base, factory
    names = klm.register()
    assert set(names) <= set(factory.get_registered_serde_types())
    ser = klm.serializer({"type": "fp8"})
    assert isinstance(ser, base.Serializer)
