"""The package users install: the wheel and the source distribution built
from the tracked files hold every module and data file `keras_vit` reads,
the licence, and nothing of the test suite."""

import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.helpers import ROOT

pytestmark = [pytest.mark.main_env, pytest.mark.one_backend]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`(wheel names, sdist names)`, built by setuptools' PEP 517 backend
    from a copy of the tracked files (what a clean clone has)."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    # (setuptools rewrites sys.argv while it builds)
    code = ("import sys; from setuptools import build_meta as b; out = sys.argv[1]; "
            "print('built', b.build_wheel(out), b.build_sdist(out))")
    result = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    wheel, sdist = next(line for line in result.stdout.splitlines() if line.startswith("built ")).split()[1:]
    with zipfile.ZipFile(out / wheel) as archive:
        wheel_names = archive.namelist()
        metadata = archive.read(next(n for n in wheel_names if n.endswith(".dist-info/METADATA"))).decode()
    with tarfile.open(out / sdist) as archive:
        sdist_names = [name.split("/", 1)[1] for name in archive.getnames() if "/" in name]
    return wheel_names, sdist_names, metadata


def test_the_wheel_holds_the_package_and_its_licence(built):
    wheel, _, metadata = built
    tracked = subprocess.run(["git", "ls-files", "keras_vit"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert sorted(n for n in wheel if n.startswith("keras_vit/")) == sorted(tracked)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel)
    assert not [n for n in wheel if n.startswith(("tests/", "recipes/", "benchmarks/"))]
    assert "Requires-Python: >=3.11" in metadata and "License-Expression: Apache-2.0" in metadata
    for extra in ("tensorflow", "jax", "torch", "recipes", "export", "hub", "test"):
        assert f"Provides-Extra: {extra}" in metadata


def test_the_source_distribution_has_no_half_test_suite(built):
    _, sdist, _ = built
    assert "LICENSE" in sdist and "pyproject.toml" in sdist
    assert "keras_vit/resources/imagenet2012_classes.txt" in sdist
    assert not [n for n in sdist if n.startswith("tests/")]
