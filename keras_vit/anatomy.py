"""What a keras_vit model looks like, read off the model itself.

The builder (`keras_vit.models.vit.ViT`) names its layers after the original
checkpoint's scopes (`embedding`, `cls`, `posembed_input`, `encoderblock_{i}`,
`encoder_norm`, `pre_logits`, `head`, and `conv_root`, `block{s}_unit{u}_*`
for a hybrid's ResNet). `anatomy(model)` is the one place that reads those
names back into a structure; the weight loader, the inspection tools, masked
patch prediction and the recipes all ask it instead of looking for layers
themselves. It lives outside `models/` so that `weights/` can use it without
importing the builders; it is public as `keras_vit.models.anatomy`.
"""

import dataclasses
import re

import keras

from keras_vit import layers as vit_layers

# The layer names the builder gives, read here and by the checkpoint mapping
# (`keras_vit.weights.npz`): one definition of each.
BLOCK_NAME = re.compile(r"^encoderblock_(\d+)$")
# Hybrid ResNet layers: the checkpoint's `block{s}/unit{u}/conv1` is the layer
# `block{s}_unit{u}_conv1` (Keras names cannot hold "/").
RESNET_LAYER_NAME = re.compile(r"^block(\d+)_unit(\d+)_(conv[123]|conv_proj|gn[123]|gn_proj)$")


@dataclasses.dataclass(frozen=True)
class ModelAnatomy:
    """The structure of a keras_vit model.

    Args:
        image_size: `(height, width)` of the model's input in pixels; for a
            dynamic-size model, the size its position embeddings are stored
            for.
        channels: channels of the input image.
        grid: `(rows, cols)` of the patch grid (of `image_size`); token
            `num_prefix_tokens + r * cols + c` is the patch at row `r`,
            column `c`.
        patch_size: `(height, width)` of one patch in input pixels. For a
            hybrid this is the ResNet stem's stride times the patch size on
            its feature map.
        embedding_patch_size: `(height, width)` of the patch embedding's
            kernel: `patch_size` for a plain ViT, the patch on the ResNet
            feature map for a hybrid.
        hidden_size: token width.
        mlp_dim: hidden width of the blocks' MLP.
        num_heads: attention heads per block.
        num_layers: number of encoder blocks.
        block_names: the blocks' layer names, in order.
        num_prefix_tokens: tokens before the grid: the class token's and
            the register tokens'.
        posemb_prefix_tokens: rows of the position embedding before its
            grid rows: `num_prefix_tokens`, or 0 for a model whose position
            embedding covers the patches only (`no_embed_class`).
        has_class_token: True when the model has a class token (at index 0).
        hybrid: True when the patch embedding reads a feature map (a ResNet
            stem) rather than the image.
        resnet: a hybrid's residual units per ResNet stage (`()` for the
            root alone), or None for a plain ViT.
        resnet_width: a hybrid's ResNet root width (64 x width factor), or
            None for a plain ViT.
        has_pre_logits: True when the model has the pre-training head's
            `pre_logits` layer (Dense + tanh).
        num_classes: width of the `head` layer, or None without a head.
        outputs_tokens: True when the model's output is the token sequence
            after `encoder_norm` (`include_top=False, pooling=None`).
        dynamic: True when the model takes any image size (an input side of
            None); its position embeddings follow each input's grid.
    """

    image_size: tuple
    channels: int
    grid: tuple
    patch_size: tuple
    embedding_patch_size: tuple
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    block_names: tuple
    num_prefix_tokens: int
    posemb_prefix_tokens: int
    has_class_token: bool
    hybrid: bool
    resnet: object
    resnet_width: object
    has_pre_logits: bool
    num_classes: object
    outputs_tokens: bool
    dynamic: bool = False

    @property
    def num_patches(self):
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.num_patches

    def grid_of(self, height, width):
        """`(rows, cols)` of the patch grid of images of `height` x `width`
        (a dynamic-size model takes any; a fixed one its own, whatever its
        input layers do to the images first: a crop, a resize)."""
        if not self.dynamic:
            return self.grid
        return height // self.patch_size[0], width // self.patch_size[1]


def _describe(model):
    return getattr(model, "name", repr(model))


def get_layer(model, name, kind=None):
    """The layer `name` of a keras_vit model, checked to be a `kind`."""
    try:
        layer = model.get_layer(name)
    except (ValueError, AttributeError):
        layer = None
    if layer is None or (kind is not None and not isinstance(layer, kind)):
        what = f"{kind.__name__} layer" if kind is not None else "layer"
        raise ValueError(
            f"The model has no {what} named {name!r}, so it is not a keras_vit "
            "ViT (or it is wrapped inside another model; pass the inner "
            f"keras_vit model). Received: model={_describe(model)!r}"
        )
    return layer


def _block_names(model):
    found = {}
    for layer in getattr(model, "layers", ()):
        match = BLOCK_NAME.match(layer.name)
        if match and isinstance(layer, vit_layers.TransformerEncoderBlock):
            found[int(match.group(1))] = layer.name
    if not found or sorted(found) != list(range(len(found))):
        raise ValueError(
            "The model has no consecutive `encoderblock_{i}` TransformerEncoderBlock "
            f"layers, so it is not a keras_vit ViT{wrapped_vit_hint(model)}. "
            f"Received: model={_describe(model)!r}"
        )
    return tuple(found[i] for i in range(len(found)))


def wrapped_vit_hint(model):
    """Where a ViT wrapped in the user's model is, for an error saying the
    model is not one; "" when it holds none."""
    inner = _inner_vit(model)
    return f"; it holds one as a layer: pass model{inner}" if inner else ""


def _inner_vit(model):
    """`.get_layer(...)` calls that reach a ViT inside the user's model, or None."""
    for layer in getattr(model, "layers", ()):
        if isinstance(layer, keras.Model):
            if any(BLOCK_NAME.match(sub.name) for sub in layer.layers):
                return f".get_layer({layer.name!r})"
            deeper = _inner_vit(layer)
            if deeper:
                return f".get_layer({layer.name!r}){deeper}"
    return None


def _resnet(model):
    """`(units per stage, root width)` of a hybrid, `(None, None)` otherwise."""
    layers = {layer.name: layer for layer in model.layers}
    root = layers.get("conv_root")
    if not isinstance(root, vit_layers.StdConv2D):
        return None, None
    units = {}
    for name in layers:
        match = RESNET_LAYER_NAME.match(name)
        if match and match.group(3) == "conv1":
            stage, unit = int(match.group(1)), int(match.group(2))
            units[stage] = max(units.get(stage, 0), unit)
    return tuple(units[s] for s in sorted(units)), root.kernel.shape[-1]


def anatomy(model):
    """The `ModelAnatomy` of a keras_vit model (plain or hybrid).

    Raises:
        ValueError: naming the model, when it is not a keras_vit ViT or has
            no fixed input size.
    """
    names = _block_names(model)
    embedding = get_layer(model, "embedding", vit_layers.PatchEmbedding)
    posemb = get_layer(model, "posembed_input", vit_layers.AddPositionEmbedding)
    # The tensor the builder took (an `input_tensor` may follow other layers:
    # a crop or a resize), not the model's own input.
    image_shape = tuple(get_layer(model, "image_size_check").input.shape)
    feature_shape = tuple(embedding.input.shape)
    dynamic = posemb.stride is not None
    if dynamic:  # The grid the position embeddings are stored for.
        rows, cols = posemb.grid
        height, width = rows * posemb.stride[0], cols * posemb.stride[1]
    else:
        height, width = image_shape[1], image_shape[2]
        rows, cols = embedding.grid_size(feature_shape)
    if None in (height, width, rows, cols) or rows == 0 or cols == 0:
        raise ValueError(
            "The model needs a fixed input size to place its patches. "
            f"Received: model input shape {image_shape}"
        )
    layer_names = {layer.name for layer in model.layers}
    has_cls = "cls" in layer_names and isinstance(model.get_layer("cls"), vit_layers.ClassToken)
    registers = model.get_layer("registers").num_tokens if "registers" in layer_names else 0
    num_prefix = int(has_cls) + registers
    head = model.get_layer("head") if "head" in layer_names else None
    first_block = model.get_layer(names[0])
    # The token sequence's last layer: `encoder_norm`, or the last block for
    # a model that normalises after pooling (`fc_norm=True`; its features
    # without pooling have no norm layer at all).
    if "encoder_norm" in layer_names:
        last = get_layer(model, "encoder_norm")
    else:
        last = model.get_layer(names[-1])
    resnet, resnet_width = _resnet(model)
    return ModelAnatomy(
        image_size=(height, width),
        channels=image_shape[3],
        grid=(rows, cols),
        # The sides are multiples of the effective stride (checked by `ViT`),
        # so this is (stem stride x patch) for hybrids and the patch otherwise.
        patch_size=(height // rows, width // cols),
        embedding_patch_size=tuple(embedding.patch_size),
        hidden_size=embedding.hidden_size,
        mlp_dim=first_block.mlp_dim,
        num_heads=first_block.num_heads,
        num_layers=len(names),
        block_names=names,
        num_prefix_tokens=num_prefix,
        posemb_prefix_tokens=posemb.pos_embedding.shape[1] - rows * cols,
        has_class_token=has_cls,
        hybrid=resnet is not None,
        resnet=resnet,
        resnet_width=resnet_width,
        has_pre_logits="pre_logits" in layer_names,
        num_classes=head.units if isinstance(head, keras.layers.Dense) else None,
        outputs_tokens=len(model.outputs) == 1 and model.outputs[0] is last.output,
        dynamic=dynamic,
    )
