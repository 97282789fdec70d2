"""``python -m kvserde.bench``: the binding against torch's own cast, and its per-call cost.

1. fp8 serialize of a bfloat16 torch tensor (256 MiB by default) through the binding,
   against ``tensor.to(torch.float8_e4m3fn)`` where this torch has it, else against
   ``tensor.half()`` (a cast of the same source bytes; it writes twice fp8's bytes).
2. The binding's overhead per call on a tiny tensor (64 elements): the full
   ``Serde.serialize`` call, the bare ctypes call of ``kvs_serialize`` with prebuilt
   arguments, and their difference (what the Python layer adds).

Options: ``--mib N`` (256), ``--repeat N`` (5, median reported), ``--calls N`` (20000).
"""

from __future__ import annotations

import argparse
import statistics
import time


def _median_time(fn, repeat: int) -> float:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvserde.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20000)
    a = ap.parse_args(argv)

    import torch

    import kvserde
    from kvserde import core

    print(f"kvserde {kvserde.version()} ({kvserde.LIBRARY_PATH}), fp8 kernels "
          f"{kvserde.fp8_isa()}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    serde = kvserde.create_serde({"type": "fp8"})
    n = a.mib * (1 << 20) // 2
    src = torch.randn(n, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty(n, dtype=torch.uint8)
    gb = n * 2 / 1e9
    serde.serialize(src, dst)  # warm the pages
    t_kvs = _median_time(lambda: serde.serialize(src, dst), a.repeat)
    fp8 = getattr(torch, "float8_e4m3fn", None)
    if fp8 is not None:
        name = "tensor.to(torch.float8_e4m3fn)"
        ref = lambda: src.to(fp8)  # noqa: E731
    else:
        name = "tensor.half() [no float8 in this torch]"
        ref = lambda: src.half()  # noqa: E731
    ref()
    t_ref = _median_time(ref, a.repeat)
    print(f"fp8 serialize of {a.mib} MiB bfloat16 [{n}] (median of {a.repeat}):")
    w = max(len(name), 24)
    print(f"  {'kvserde Serde.serialize':<{w}} {t_kvs * 1e3:8.2f} ms {gb / t_kvs:6.2f} GB/s of source")
    print(f"  {name:<{w}} {t_ref * 1e3:8.2f} ms {gb / t_ref:6.2f} GB/s of source")
    print(f"  {'speed-up':<{w}} {t_ref / t_kvs:8.2f}x (torch time / kvserde time)")
    src = dst = ref = None  # free the big tensors before the tiny-call loop

    tiny = torch.randn(64).to(torch.bfloat16)
    out = torch.empty(64, dtype=torch.uint8)
    serde.serialize(tiny, out)
    s = core._scratch()  # this thread's structs, as the call above left them
    pcs, pcd, pnw = s[5], s[6], s[9]
    f, h = core.lib.kvs_serialize, serde._h

    def full():
        for _ in range(a.calls):
            serde.serialize(tiny, out)

    def bare():
        for _ in range(a.calls):
            f(h, pcs, pcd, None, pnw)

    t_full = _median_time(full, a.repeat) / a.calls
    t_bare = _median_time(bare, a.repeat) / a.calls
    print(f"per call on a 64-element tensor (median of {a.repeat} x {a.calls} calls):")
    print(f"  {'Serde.serialize':<26} {t_full * 1e6:8.2f} us")
    print(f"  {'bare ctypes kvs_serialize':<26} {t_bare * 1e6:8.2f} us")
    print(f"  {'binding overhead':<26} {(t_full - t_bare) * 1e6:8.2f} us (aim: < 5 us)")
    serde.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
