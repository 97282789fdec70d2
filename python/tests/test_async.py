"""Processor and L2 adapter: fds readable exactly once per task, pop-once queries,
asyncio / selectors integration, close and GC free every fd and thread."""

import asyncio
import gc
import os
import selectors
import threading

import pytest

import kvserde

torch = pytest.importorskip("torch")


def bf16(n):
    return (torch.arange(n, dtype=torch.float32) % 64 / 32 + 1).to(torch.bfloat16)


def keys(n, model="m"):
    return [kvserde.ObjectKey(bytes([i, 7]), model) for i in range(n)]


def wait_readable(fd, timeout=20):
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        assert sel.select(timeout), f"fd {fd} not readable within {timeout}s"
    finally:
        sel.close()


def fd_count():
    return len(os.listdir("/proc/self/fd"))


def task_count():
    return len(os.listdir("/proc/self/task"))


def test_processor_serialize_deserialize_once_per_task():
    with kvserde.Processor({"type": "pipeline", "stages": [{"type": "fp8"}],
                            "max_workers": 2}) as p:
        sfd, dfd = p.serialize_event_fd, p.deserialize_event_fd
        assert sfd != dfd and sfd >= 0
        src = [bf16(4096) for _ in range(3)]
        est = p.estimate(src[0])
        blobs = [bytearray(est) for _ in range(3)]
        dsts = [kvserde.MemoryObject(b) for b in blobs]
        tid = p.submit_serialize(src, dsts, keys(3))
        wait_readable(sfd)
        assert kvserde.consume_event_fd(sfd) == 1  # exactly one count for the task
        assert kvserde.consume_event_fd(sfd) == 0
        r = p.query_serialize_result(tid)
        assert r.ok and r and r.used_sizes == [d.used_size for d in dsts]
        assert all(4096 < n <= est for n in r.used_sizes)
        assert p.query_serialize_result(tid) is None  # popped once
        outs = [torch.zeros(4096, dtype=torch.bfloat16) for _ in range(3)]
        tid2 = p.submit_deserialize(dsts, outs, keys(3))
        assert tid2 == tid + 1
        wait_readable(dfd)
        assert kvserde.consume_event_fd(dfd) == 1
        assert p.query_serialize_result(tid2) is None  # other direction: pending
        r2 = p.query_deserialize_result(tid2)
        assert r2.ok and all(torch.allclose(o.float(), s.float(), rtol=0.07)
                             for o, s in zip(outs, src))
        # a failing task carries its code and message
        tid3 = p.submit_deserialize(dsts, outs, keys(3, model="other"))
        wait_readable(dfd)
        r3 = p.query_deserialize_result(tid3)
        assert not r3 and r3.status == -10 and r3.failed_index == 0
        assert isinstance(r3.error, kvserde.KeyMismatchError)
        with pytest.raises(kvserde.KeyMismatchError):
            r3.raise_for_error()
    with pytest.raises(kvserde.ClosedError):
        p.submit_serialize([], [])
    assert p.query_serialize_result(0) is None


def test_processor_with_asyncio_add_reader():
    async def main():
        loop = asyncio.get_running_loop()
        with kvserde.Processor({"type": "fp8"}) as p:
            done = loop.create_future()
            src = bf16(1024)
            dst = bytearray(p.estimate(src))
            tid = p.submit_serialize([src], [dst])

            def ready():
                kvserde.consume_event_fd(p.serialize_event_fd)
                r = p.query_serialize_result(tid)
                if r is not None and not done.done():
                    done.set_result(r)

            loop.add_reader(p.serialize_event_fd, ready)
            try:
                r = await asyncio.wait_for(done, 20)
            finally:
                loop.remove_reader(p.serialize_event_fd)
            return r

    r = asyncio.run(main())
    assert r.ok and r.used_sizes == [1024]


def test_processor_argument_errors():
    with kvserde.Processor({"type": "fp8"}) as p:
        with pytest.raises(kvserde.InvalidError, match="2 sources but 1"):
            p.submit_serialize([bf16(8), bf16(8)], [bytearray(16)])
        with pytest.raises(kvserde.InvalidError, match="keys"):
            p.submit_serialize([bf16(8)], [bytearray(16)], keys(2))
    with pytest.raises(kvserde.InvalidError, match="max_workers"):
        kvserde.Processor({"type": "fp8", "max_workers": 0})


@pytest.mark.parametrize("spec", [{"type": "memory"},
                                  {"type": "memory", "serde": {"type": "fp8"}},
                                  "fs"])
def test_l2_store_lookup_load_delete(spec, tmp_path):
    if spec == "fs":
        spec = {"type": "fs", "path": str(tmp_path / "l2"), "fsync": False,
                "serde": {"type": "pipeline", "stages": [{"type": "fp8"}]}}
    with kvserde.L2Adapter.create(spec) as a:
        fds = (a.store_event_fd, a.lookup_event_fd, a.load_event_fd)
        assert len(set(fds)) == 3
        k = keys(2)
        src = [bf16(2048), bf16(2048) * 2]
        tid = a.store(k, src)
        wait_readable(a.store_event_fd)
        assert kvserde.consume_event_fd(a.store_event_fd) == 1
        (res,) = a.pop_completed_stores()
        assert res.task_id == tid and res.ok and res.bytes_written > 0
        assert a.pop_completed_stores() == []
        lid = a.lookup_and_lock(k + keys(3)[2:])
        wait_readable(a.lookup_event_fd)
        assert kvserde.consume_event_fd(a.lookup_event_fd) == 1
        assert a.query_lookup_and_lock(lid).hits == [True, True, False]
        assert a.query_lookup_and_lock(lid) is None
        assert a.delete(k[:1]) == [False]  # locked
        a.unlock(k)
        outs = [torch.zeros(2048, dtype=torch.bfloat16) for _ in range(2)]
        did = a.load(k, outs)
        wait_readable(a.load_event_fd)
        assert kvserde.consume_event_fd(a.load_event_fd) == 1
        r = a.query_load(did)
        assert r.hits == [True, True] and r.status == 0
        assert a.query_load(did) is None
        assert torch.allclose(outs[1].float(), src[1].float(), rtol=0.07)
        used, cap = a.usage()
        assert used > 0 and cap == 0
        st = a.status()
        assert st["is_healthy"] is True and "type" in st
        assert a.delete(k) == [True, True]
        assert a.object_sizes(k) == [-1, -1]
    with pytest.raises(kvserde.ClosedError):
        a.store([], [])


def test_l2_bad_spec():
    with pytest.raises(kvserde.InvalidError, match="'serde' must be a dict"):
        kvserde.L2Adapter.create({"type": "memory", "serde": "fp8"})


def test_close_and_gc_free_fds_and_threads(tmp_path):
    def make_all():
        p = kvserde.Processor({"type": "fp8", "max_workers": 3})
        a = kvserde.L2Adapter.create({"type": "fs", "path": str(tmp_path / "g"),
                                      "serde": {"type": "fp8"}, "workers": 2})
        s = kvserde.create_serde({"type": "fp8"})
        tid = p.submit_serialize([bf16(64)], [bytearray(128)])  # left unread
        a.store(keys(1), [bf16(64)])
        return p, a, s, tid

    for _ in range(2):  # warm up lazy one-time state (registries, imports)
        objs = make_all()
        [o.close() for o in objs[:3]]
    fds, tasks, pythreads = fd_count(), task_count(), threading.active_count()
    objs = make_all()
    assert fd_count() > fds and task_count() > tasks
    for o in objs[:3]:  # explicit close
        o.close()
        o.close()  # idempotent
    assert (fd_count(), task_count()) == (fds, tasks)
    objs = make_all()
    del objs  # garbage collection frees them too
    gc.collect()
    assert (fd_count(), task_count(), threading.active_count()) == (fds, tasks, pythreads)


def test_multi_processor_kv_split():
    with kvserde.create_processor({"type": "kv_split", "max_workers": 2}) as p:
        assert isinstance(p, kvserde.MultiProcessor) and p.group_size == 2
        ks, vs = [bf16(1024) for _ in range(2)], [bf16(1024) * 2 for _ in range(2)]
        est = p.estimate([ks[0], vs[0]])
        blobs = [kvserde.MemoryObject(bytearray(est)) for _ in range(2)]
        tid = p.submit_serialize(list(zip(ks, vs)), blobs, keys(2))
        wait_readable(p.serialize_event_fd)
        assert kvserde.consume_event_fd(p.serialize_event_fd) == 1
        r = p.query_serialize_result(tid)
        assert r.ok and r.used_sizes == [b.used_size for b in blobs] and \
            all(0 < n <= est for n in r.used_sizes)
        k2, v2 = torch.zeros(1024, dtype=torch.bfloat16), torch.zeros(1024, dtype=torch.bfloat16)
        tid = p.submit_deserialize(blobs[1:], [(k2, v2)], keys(2)[1:])
        wait_readable(p.deserialize_event_fd)
        assert p.query_deserialize_result(tid).ok
        assert torch.equal(k2, ks[1]) and torch.allclose(v2.float(), vs[1].float(), rtol=0.07)
        with pytest.raises(kvserde.InvalidError, match="group 0 has 1 slots"):
            p.submit_serialize([(ks[0],)], blobs[:1])
