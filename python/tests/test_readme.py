"""The README's Python example is python/examples/readme_example.py, verbatim, and runs."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "python", "examples", "readme_example.py")


def test_readme_holds_the_example():
    with open(EXAMPLE) as f:
        text = f.read()
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert f"```python\n{text}```" in readme, "paste python/examples/readme_example.py into README.md"
    assert len(text.strip().splitlines()) <= 12


def test_readme_example_runs():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, EXAMPLE], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "16384 bytes -> 8272 bytes, max error 0.1250\n"


def test_make_install_puts_an_importable_package(tmp_path):
    """`cmake --install` (what `make install` runs) into a scratch prefix: the package
    and its copy of libkvserde.so land in the system Python's dist-packages layout, and
    import there with no KVSERDE_LIBRARY and no LD_LIBRARY_PATH."""
    import pytest
    build, cmake = os.environ.get("KVSERDE_BUILD_DIR"), os.environ.get("KVSERDE_CMAKE")
    if not build or not cmake:
        pytest.skip("KVSERDE_BUILD_DIR / KVSERDE_CMAKE not set (ctest sets them)")
    r = subprocess.run([cmake, "--install", build, "--prefix", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    pkgs = list(tmp_path.glob("**/dist-packages/kvserde/__init__.py")) + \
        list(tmp_path.glob("**/site-packages/kvserde/__init__.py"))
    assert len(pkgs) == 1, pkgs
    site = pkgs[0].parent.parent
    assert (site / "kvserde" / "libkvserde.so").exists()
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVSERDE_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, "-c",
                          "import kvserde; print(kvserde.LIBRARY_PATH); "
                          "print(len(kvserde.create_serde({'type': 'fp8'}).serialize(bytearray(8), layout=kvserde.Layout([(4,)], ['bfloat16']))))"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    lib, n = out.stdout.split()
    assert lib == str(site / "kvserde" / "libkvserde.so") and n == "4"
