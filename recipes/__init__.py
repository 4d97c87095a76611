"""Recipes: command-line entry points over keras_vit's library code.

Run them from the repository root, e.g. `python -m recipes.demo`,
`python -m recipes.finetune --config=cifar10`, `python -m recipes.vtab`.
See docs/recipes.md and docs/vtab.md.
"""
