"""What can be built and loaded: model names, constructors and checkpoints."""

import collections
import fnmatch

from keras_vit import variants
from keras_vit.weights import registry

ModelInfo = collections.namedtuple("ModelInfo", ["name", "constructor", "augreg_name", "weights"])
ModelInfo.__doc__ = """One buildable model.

Fields:
    name: the original config name (`"ViT-B_16"`), accepted by `get_model`.
    constructor: the `keras_vit` function that builds it (`"ViTB16"`), or
        None for configs without one (`"ViT-B_16-gap-norep"`, `"testing"`).
    augreg_name: the short name (`"B_16"`, vit_jax's AugReg configs;
        dropout 0), or None for the test and GSAM configs. Not every model
        with one has AugReg checkpoints: `weights` lists what is published.
    weights: the registered checkpoint names published for it.
"""


def available_weights(name):
    """The registered checkpoint names (`weights=`) published for a model.

    Args:
        name: a constructor name (`"ViTB16"`), an original config name
            (`"ViT-B_16"`) or an AugReg name (`"B_16"`, `"B/16"`).

    Returns:
        A list such as `["imagenet21k", "imagenet21k+imagenet2012",
        "augreg", "augreg+imagenet2012", "sam"]`; any AugReg file name of the
        model is accepted as well (see `keras_vit.weights.augreg_index`).
    """
    return registry.registered_names(variants.resolve_variant(name)[0])


def list_models(pattern=None):
    """Lists the models `get_model` builds, with their constructors.

    Args:
        pattern: None for all, or a case-insensitive shell-style pattern
            (`"*B_16*"`, `"R50*"`, `"ViTL*"`, `"B/16"`) matched against the
            original name, the constructor name and the AugReg name (a
            big_vision-style "/" reads as the AugReg name's "_").

    Returns:
        A list of `ModelInfo(name, constructor, augreg_name, weights)`, in
        the order of the variant table.
    """
    if pattern is not None and not isinstance(pattern, str):
        raise ValueError(f"`pattern` must be None or a string. Received: pattern={pattern!r}")
    if pattern is not None:
        patterns = {pattern.lower(), variants.short_name(pattern.lower())}
    constructors = {config: function for function, config in variants.CONSTRUCTORS.items()}
    augreg = {config: short for short, config in variants.AUGREG_NAMES.items()}
    found = []
    for name in variants.VARIANTS:
        info = ModelInfo(
            name=name,
            constructor=constructors.get(name),
            augreg_name=augreg.get(name),
            weights=available_weights(name),
        )
        keys = [key for key in info[:3] if key]
        if pattern is None or any(fnmatch.fnmatch(key.lower(), wanted) for key in keys for wanted in patterns):
            found.append(info)
    return found
