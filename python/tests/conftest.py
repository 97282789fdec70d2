"""pytest setup: import the package from this checkout (python/kvserde), with the
library named by $KVSERDE_LIBRARY (ctest sets it to build/libkvserde.so)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

if "KVSERDE_LIBRARY" not in os.environ:
    cand = os.path.join(os.path.dirname(os.path.dirname(HERE)), "build", "libkvserde.so")
    if os.path.exists(cand):
        os.environ["KVSERDE_LIBRARY"] = cand


def pytest_report_header(config):
    import kvserde
    try:
        import torch
        t = f"torch {torch.__version__}"
    except ImportError:
        t = "torch not installed"
    return f"kvserde {kvserde.version()} from {kvserde.LIBRARY_PATH}; {t}"
