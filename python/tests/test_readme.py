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
