"""The documentation stays true: the README quick start runs as written and
the generated tables match their single sources."""

import re

import pytest

from tests.helpers import ROOT


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", readme, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README quick start", "exec"), namespace)
    assert namespace["logits"].shape == (2, 10)
    assert (tmp_path / "vit_b16.npz").exists()
    probe = namespace["probe"]
    assert probe.output.shape[-1] == 5
    assert [w.path.split("/")[-2] for w in probe.trainable_weights] == ["head", "head"]


def generated_block(path, marker):
    text = (ROOT / "docs" / path).read_text()
    return re.search(rf"<!-- {marker}:begin -->\n(.*?)\n<!-- {marker}:end -->", text, re.DOTALL).group(1)


def tools():
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_docs_tables
    finally:
        sys.path.pop(0)
    return gen_docs_tables


@pytest.mark.one_backend
def test_weights_table_is_current():
    assert generated_block("weights.md", "weights") == tools().weights_table()


@pytest.mark.one_backend
def test_variants_table_is_current():
    documented = [
        row.rsplit("|", 2)[0] + "|" for row in generated_block("models.md", "variants").splitlines()
    ]
    expected = tools().variants_table(with_params=False).splitlines()
    assert len(documented) == len(expected)
    for doc_row, row in zip(documented[2:], expected[2:]):
        assert doc_row == row


@pytest.mark.one_backend
def test_hybrid_table_names_every_hybrid_as_the_library_does():
    """The hand-written hybrid table's names (it said "–" for two AugReg
    names that `get_model` accepts)."""
    from keras_vit import variants

    text = (ROOT / "docs" / "models.md").read_text()
    rows = re.findall(r"^\| `(R[^`]*)` \| `([^`]*)` \| `([^`]*)` \|", text, re.MULTILINE)
    assert sorted(row[0] for row in rows) == sorted(name for name in variants.CONSTRUCTORS.values()
                                                    if variants.VARIANTS[name].get("resnet") is not None)
    for config_name, augreg, constructor in rows:
        assert (augreg, constructor) == (variants.augreg_name(config_name), variants.constructor_name(config_name))


def _floors_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)', text))


def _pins_in(requirements):
    text = (ROOT / "requirements" / requirements).read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([0-9.]+)", text, re.MULTILINE))


@pytest.mark.one_backend
def test_declared_floors_are_the_versions_ci_tests():
    """Every floor pyproject declares for a backend, Keras, numpy or tfds is
    exactly what requirements/lowest.txt installs for the lowest-versions run,
    and keras_vit's import-time Keras check says the same."""
    import keras_vit

    floors, lowest = _floors_in_pyproject(), _pins_in("lowest.txt")
    for package in ["keras", "numpy", "tensorflow-cpu", "jax", "torch", "tensorflow-datasets"]:
        assert floors[package] == lowest[package], (package, floors[package], lowest[package])
    assert ".".join(map(str, keras_vit.MIN_KERAS_VERSION)) + ".0" == lowest["keras"]
    readme = (ROOT / "README.md").read_text()
    for package in ["keras", "tensorflow-cpu", "jax", "torch", "tensorflow-datasets"]:
        assert f"{package} {lowest[package]}" in readme, f"README does not name {package} {lowest[package]}"
        assert f"{package} {_pins_in('test.txt')[package]}" in readme, package
    # The Python 3.12 environment (no PyTorch there) and the tested range.
    for package in ["keras", "tensorflow-cpu", "jax", "tensorflow-datasets"]:
        assert f"{package} {_pins_in('py312.txt')[package]}" in readme, package
    assert "torch" not in _pins_in("py312.txt")
    pyproject = (ROOT / "pyproject.toml").read_text()
    pythons = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', pyproject)
    assert pythons == ["3.11", "3.12"] and 'requires-python = ">=3.11"' in pyproject, pythons
    assert "Python 3.11–3.12" in readme


@pytest.mark.one_backend
def test_old_keras_is_refused_at_import_with_the_version(monkeypatch):
    import importlib
    import sys

    import keras

    monkeypatch.setattr(keras, "__version__", "3.9.2")
    saved = {name: module for name, module in sys.modules.items() if name.startswith("keras_vit")}
    for name in saved:
        monkeypatch.delitem(sys.modules, name)
    try:
        with __import__("pytest").raises(ImportError, match=r"Keras >= 3\.10.*keras==3\.9\.2"):
            importlib.import_module("keras_vit")
    finally:
        sys.modules.update(saved)


@pytest.mark.one_backend
def test_backends_are_imported_only_where_the_rules_allow():
    """One codebase, three backends: outside `keras_vit/data` (tf.data
    pipelines) and `keras_vit/distribute.py` (strategies and random state,
    imported lazily inside functions) nothing under keras_vit/ imports
    tensorflow, jax or torch; everything else goes through keras.ops."""
    import ast

    package = ROOT / "keras_vit"
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        tree = ast.parse(path.read_text())
        top_level = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                if root not in ("tensorflow", "jax", "torch", "tensorflow_datasets"):
                    continue
                if relative.startswith("data/") and root in ("tensorflow", "tensorflow_datasets"):
                    continue
                if relative == "distribute.py" and id(node) not in top_level:
                    continue
                found.append(f"{relative}:{node.lineno} imports {name}")
    assert not found, found
