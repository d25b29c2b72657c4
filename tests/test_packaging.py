"""The install is honest: the built wheel claims no top-level module names in site-packages (the
repository is the working tree; `kernels`, `methods`, `tasks`, `runners`, `reports` are generic,
and `kernels` is Hugging Face's kernel-hub package that transformers probes)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_the_wheel_installs_metadata_and_dependencies_only(tmp_path):
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path)]  # as setup.sh builds
    build = subprocess.run([*cmd, str(REPO)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("kvbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert all(t.endswith(".dist-info") for t in top), sorted(top)
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "Requires-Dist: transformers" in metadata and "Requires-Dist: hydra-core" in metadata
