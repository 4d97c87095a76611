"""Dense feature maps from a ViT's patch tokens, for dense-prediction heads
(segmentation, detection: ViTDet, DPT, SETR read the tokens as a grid)."""

import keras
from keras import ops

from keras_vit.anatomy import anatomy
from keras_vit.anatomy import get_layer
from keras_vit.layers.utils import is_int
from keras_vit.layers.utils import patch_grid
from keras_vit.models.vit_model import ViTModel


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchGrid(keras.layers.Layer):
    """`(B, prefix + rows * cols, D)` tokens -> `(B, rows, cols, D)` maps.

    The prefix tokens (class, registers) are left out; the grid's size is
    read from the images at call time (`rows = height // stride`), the
    inverse of `PatchEmbedding`'s row-major flattening.

    Args:
        num_prefix_tokens: int. Tokens before the patches.
        stride: `(height, width)` of one patch in image pixels (for a
            hybrid: the ResNet stem's stride times the patch size).

    Call arguments:
        tokens: `(B, T, D)` tensor.
        images: the model's `(B, H, W, C)` input.
    """

    def __init__(self, num_prefix_tokens, stride, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = tuple(int(s) for s in stride)

    def call(self, tokens, images):
        rows, cols = patch_grid(images, self.stride)
        count = tokens.shape[1]
        if is_int(count) and is_int(rows) and is_int(cols) and count != self.num_prefix_tokens + rows * cols:
            # A reshape to (-1, rows, cols, D) would fold the mismatch into the batch.
            raise ValueError(
                f"{count} tokens are not {self.num_prefix_tokens} prefix tokens and a {rows}x{cols} grid of "
                f"images of {tuple(images.shape[1:3])} px at stride {self.stride}: `images` must be the images the "
                f"tokens were computed from. Received: tokens of shape {tuple(tokens.shape)}"
            )
        width = tokens.shape[-1] if tokens.shape[-1] is not None else ops.shape(tokens)[-1]
        return ops.reshape(tokens[:, self.num_prefix_tokens:], (-1, rows, cols, width))

    def compute_output_shape(self, tokens_shape, images_shape):
        rows, cols = (None if s is None else s // stride for s, stride in zip(images_shape[1:3], self.stride))
        return (tokens_shape[0], rows, cols, tokens_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(num_prefix_tokens=self.num_prefix_tokens, stride=self.stride)
        return config


def feature_maps(model):
    """A model giving `(B, H / P, W / P, D)` feature maps of a keras_vit
    model whose output is its token sequence (`include_top=False,
    pooling=None`): the patch tokens after the final LayerNorm, as a grid.
    Shares `model`'s layers and weights."""
    parts = anatomy(model)
    if not parts.outputs_tokens:
        raise ValueError(
            "`feature_maps` reads the token sequence: build the model with include_top=False, pooling=None. "
            f"Received: model {model.name!r} with output shape {tuple(model.output.shape)}"
        )
    # The images the builder took (an `input_tensor` may follow a crop or a
    # resize), not the model's own input.
    images = get_layer(model, "image_size_check").input
    # The tokens' own dtype, not the global policy's: a float32 model's maps
    # made after `set_dtype_policy("mixed_bfloat16")` were rounded to bfloat16.
    grid = PatchGrid(parts.num_prefix_tokens, parts.patch_size, dtype=model.output.dtype,
                     name="feature_maps")(model.output, images)
    return ViTModel(model.inputs[0], grid, name=f"{model.name}_feature_maps")
