"""The documentation stays true: the README quick start runs as written and
the generated tables match their single sources."""

import pathlib
import re


ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_readme_quick_start_runs(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", readme, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README quick start", "exec"), namespace)
    assert namespace["logits"].shape == (2, 10)
    assert (tmp_path / "vit_b16.npz").exists()


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


def test_weights_table_is_current():
    assert generated_block("weights.md", "weights") == tools().weights_table()


def test_variants_table_is_current():
    documented = [
        row.rsplit("|", 2)[0] + "|" for row in generated_block("models.md", "variants").splitlines()
    ]
    expected = tools().variants_table(with_params=False).splitlines()
    assert len(documented) == len(expected)
    for doc_row, row in zip(documented[2:], expected[2:]):
        assert doc_row == row
