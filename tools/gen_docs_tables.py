"""Regenerates the generated tables in docs/ from the single sources.

    KERAS_BACKEND=torch python tools/gen_docs_tables.py

- docs/models.md, between the `variants` markers: every entry of
  `keras_vit.variants.VARIANTS` with its parameter count (built here).
- docs/weights.md, between the `weights` markers: the registered checkpoints
  of `keras_vit.weights.registry`.
"""

import pathlib
import re

import keras_vit
from keras_vit import variants

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def variants_table(with_params=True):
    header = (
        "| config name | constructor | patch | width | MLP | heads | blocks | dropout "
        "| classifier | ResNet stages |" + (" params (1000 classes, 224 px) |" if with_params else "")
    )
    rows = [header, "|" + "---|" * (header.count("|") - 1)]
    constructors = {config: function for function, config in variants.CONSTRUCTORS.items()}
    for name, f in variants.VARIANTS.items():
        resnet = "–" if f["resnet"] is None else (str(tuple(f["resnet"])) if f["resnet"] else "root only")
        row = (
            f"| `{name}` | {('`' + constructors[name] + '`') if name in constructors else '–'} "
            f"| {f['patch_size']} | {f['hidden_size']} | {f['mlp_dim']} | {f['num_heads']} "
            f"| {f['num_layers']} | {f['dropout_rate']} | {f['classifier']} | {resnet} |"
        )
        if with_params:
            row += f" {keras_vit.get_model(name).count_params():,} |"
        rows.append(row)
    return "\n".join(rows)


def weights_table():
    rows = ["| model | registered names |", "|---|---|"]
    for name in variants.VARIANTS:
        names = keras_vit.available_weights(name)
        if names:
            rows.append(f"| `{name}` | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows)


def replace_block(path, marker, text):
    content = path.read_text()
    pattern = re.compile(
        rf"(<!-- {marker}:begin -->\n).*?(<!-- {marker}:end -->)", re.DOTALL
    )
    assert pattern.search(content), f"markers {marker} missing in {path}"
    path.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), content))


if __name__ == "__main__":
    replace_block(DOCS / "models.md", "variants", variants_table())
    replace_block(DOCS / "weights.md", "weights", weights_table())
    print("updated docs/models.md and docs/weights.md")
