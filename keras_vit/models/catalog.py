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
    augreg_name: the AugReg name (`"B_16"`), or None for configs outside the
        AugReg release.
    weights: the registered checkpoint names published for it.
"""


def _config_name(name):
    if isinstance(name, str) and name in variants.CONSTRUCTORS:
        return variants.CONSTRUCTORS[name]
    return variants.resolve_variant(name)[0]


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
    return registry.registered_names(_config_name(name))


def list_models(pattern=None):
    """Lists the models `get_model` builds, with their constructors.

    Args:
        pattern: None for all, or a case-insensitive shell-style pattern
            (`"*B_16*"`, `"R50*"`, `"ViTL*"`) matched against the original
            name, the constructor name and the AugReg name.

    Returns:
        A list of `ModelInfo(name, constructor, augreg_name, weights)`, in
        the order of the variant table.
    """
    if pattern is not None and not isinstance(pattern, str):
        raise ValueError(f"`pattern` must be None or a string. Received: pattern={pattern!r}")
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
        if pattern is None or any(fnmatch.fnmatch(key.lower(), pattern.lower()) for key in keys):
            found.append(info)
    return found
