"""The README's Python example, run as written against the simulated
engines (its `router.toml` lists them)."""

import os
import re
import subprocess
import sys

from engines import ROOT, Engines


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- python-example:[^>]*-->\n```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its Python example"
    return m.group(1)


def test_the_readme_example_runs(tmp_path):
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12, "the README promises a short example"
    engines = Engines()
    try:
        (tmp_path / "router.toml").write_text(engines.config())
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=dict(os.environ)
        )
    finally:
        engines.close()
    assert out.returncode == 0, out.stderr
    names = {p["name"] for p in engines.pods}
    first = out.stdout.splitlines()[0].split()
    assert first[0] in names and first[1].startswith("http://127.0.0.1:"), out.stdout
    assert re.search(r"^\d+ lines of Prometheus metrics$", out.stdout, re.M), out.stdout
