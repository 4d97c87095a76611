"""The BiT-style ResNet stem of the hybrid ResNet+ViT models.

Paper Sec. 3.1 ("Hybrid Architecture") and 4.1: the patch embedding is
applied to a ResNet feature map instead of raw pixels. The ResNet is the one
of the original code (google-research/vision_transformer, `models_vit.py` and
`models_resnet.py`), after BiT (arXiv:1912.11370): weight-standardised
convolutions, GroupNorm with 32 groups, ResNet-v1 (post-activation)
bottleneck units with the stride on the 3x3 convolution.

The graph is built functionally inside the ViT model, with flat layer names
derived from the checkpoint keys (`block1/unit1/conv1` -> layer
`block1_unit1_conv1`), so every intermediate is reachable by name:

- `pool_root`: the root's output (stride 4, `64 * width_factor` channels);
- `block{s}`: the output of stage `s` (stride `4 * 2 ** (s - 1)`,
  `256 * 2 ** (s - 1) * width_factor` channels);
- `block{s}_unit{u}_out`: the output of each residual unit.
"""

import keras

from keras_vit.layers.std_conv import StdConv2D
from keras_vit.layers.utils import is_int
from keras_vit.layers.utils import is_real
from keras_vit.variants import ROOT_WIDTH

# Flax GroupNorm defaults, used by the original; Keras' default epsilon is 1e-3.
GROUP_NORM_GROUPS = 32
GROUP_NORM_EPSILON = 1e-6
# Root conv stride 2 x max-pool stride 2.
ROOT_STRIDE = 4


def check_resnet(num_layers, width_factor):
    """Validates the stage sizes and width factor; returns `(stages, width)`."""
    try:
        stages = tuple(num_layers)
    except TypeError:
        stages = None
    if stages is None or not all(is_int(n) and n > 0 for n in stages):
        raise ValueError(
            "`resnet` must be None (a plain ViT) or a tuple of positive ints, the "
            "number of residual units per stage (`()` for the root alone). "
            f"Received: resnet={num_layers!r}"
        )
    # Numpy numbers too (values from an array); NaN and infinity refused
    # before `int` (which raised on them, naming neither).
    width = ROOT_WIDTH * width_factor if is_real(width_factor) else 0
    if width <= 0 or width != int(width) or int(width) % GROUP_NORM_GROUPS:
        raise ValueError(
            f"`resnet_width_factor` must make the root width {ROOT_WIDTH} x "
            f"resnet_width_factor a positive multiple of {GROUP_NORM_GROUPS} (the "
            f"GroupNorm groups), e.g. 0.5, 1 or 2. "
            f"Received: resnet_width_factor={width_factor!r}"
        )
    return tuple(int(n) for n in stages), int(width)


def stem_stride(num_layers):
    """Total stride of the stem: 4 for the root, x2 for every stage after the first."""
    return ROOT_STRIDE * 2 ** max(len(num_layers) - 1, 0)


def _group_norm(name, zero_scale=False):
    return keras.layers.GroupNormalization(
        groups=GROUP_NORM_GROUPS,
        epsilon=GROUP_NORM_EPSILON,
        gamma_initializer="zeros" if zero_scale else "ones",
        name=name,
    )


def _residual_unit(x, features, strides, name):
    """Bottleneck unit: 1x1 -> 3x3 (strided) -> 1x1 (4x features), post-activation."""
    # A projection shortcut whenever the shape changes (models_resnet.py).
    needs_projection = x.shape[-1] != 4 * features or strides != 1
    shortcut = x
    if needs_projection:
        shortcut = StdConv2D(4 * features, 1, strides, name=f"{name}_conv_proj")(x)
        shortcut = _group_norm(f"{name}_gn_proj")(shortcut)
    y = StdConv2D(features, 1, name=f"{name}_conv1")(x)
    y = _group_norm(f"{name}_gn1")(y)
    y = keras.layers.ReLU(name=f"{name}_relu1")(y)
    y = StdConv2D(features, 3, strides, name=f"{name}_conv2")(y)
    y = _group_norm(f"{name}_gn2")(y)
    y = keras.layers.ReLU(name=f"{name}_relu2")(y)
    y = StdConv2D(4 * features, 1, name=f"{name}_conv3")(y)
    # Zero-initialised last scale: each unit starts as its shortcut (BiT).
    y = _group_norm(f"{name}_gn3", zero_scale=True)(y)
    y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
    return keras.layers.ReLU(name=f"{name}_out")(y)


def resnet_stem(inputs, num_layers, width_factor=1):
    """Builds the hybrid's ResNet on `inputs`; returns its feature map.

    Root: StdConv 7x7/2 -> GroupNorm -> ReLU -> max-pool 3x3/2 (SAME). Then one
    stage per entry of `num_layers`; stage `s` has bottleneck width
    `width * 2 ** (s - 1)`, its first unit strides by 2 except in stage 1.

    Args:
        inputs: `(B, H, W, 3)` Keras tensor.
        num_layers: tuple of ints, residual units per stage; `()` builds the
            root alone (R+ViT-Ti/16).
        width_factor: number. Root width is `64 * width_factor` (1 in every
            published model).

    Returns:
        The `(B, H / stride, W / stride, C)` feature map, with
        `stride = stem_stride(num_layers)`.
    """
    num_layers, width = check_resnet(num_layers, width_factor)
    x = StdConv2D(width, 7, 2, name="conv_root")(inputs)
    x = _group_norm("gn_root")(x)
    x = keras.layers.ReLU(name="relu_root")(x)
    # TF "SAME" max-pool; padded cells never win (inputs are >= 0 after ReLU).
    # Pinned like every conv here: a global `channels_first` must not pool over (W, C).
    x = keras.layers.MaxPooling2D(3, strides=2, padding="same", data_format="channels_last", name="pool_root")(x)
    for s, units in enumerate(num_layers, start=1):
        features = width * 2 ** (s - 1)
        for u in range(1, units + 1):
            strides = 2 if (u == 1 and s > 1) else 1
            x = _residual_unit(x, features, strides, name=f"block{s}_unit{u}")
        x = keras.layers.Identity(name=f"block{s}")(x)
    return x
