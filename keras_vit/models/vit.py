"""Functional ViT models in the keras.applications idiom."""

import keras

from keras_vit import layers as vit_layers
from keras_vit.layers.encoder_block import LAYER_NORM_EPSILON, check_gelu
from keras_vit.layers.pooling import pooled_prefix_tokens
from keras_vit.layers.position_embedding import check_interpolation
from keras_vit.layers.utils import check_bool, check_rate, head_dtype, is_int, is_real, normalize_pair, positive_int
from keras_vit.models import resnet as resnet_lib
from keras_vit.models.vit_model import ViTModel
from keras_vit.weights import load_weights
from keras_vit import variants

DEFAULT_INPUT_SHAPE = (224, 224, 3)
POOLINGS = (None, "token", "gap", "avg", "map")

# Keywords that change the architecture or regularisation, beyond the table.
# `resnet_width_factor` scales the hybrids' ResNet (root width 64 x factor;
# 1 in every published model). The rest are the options of later ViT
# families (timm's names in brackets where they differ); each default is the
# original architecture.
EXTRA_FIELDS = dict(
    drop_path_rate=0.0, head_bias_init=0.0, resnet_width_factor=1,
    gelu="tanh", layer_norm_epsilon=LAYER_NORM_EPSILON,
    class_token=None,  # None: the classifier's (a class token for "token")
    num_register_tokens=0,  # [reg_tokens]
    no_embed_class=False,  # position embeddings for the patches only
    layer_scale_init=None,  # [init_values]
    pre_norm=False,  # a LayerNorm before the encoder [norm_pre]
    fc_norm=False,  # the final LayerNorm after pooling, not before
    patch_bias=True,
    qk_norm=False,  # LayerNorm on each head's queries and keys
    # Whether pooling takes the class and register tokens in; None: not for
    # a "gap" or "map" classifier (timm's default), every token for the
    # `pooling=` of features.
    pool_include_prefix=None,
)


def _check_input_shape(input_shape, stride, stem_stride=1, patch=None):
    """Validates `(H, W, C)` and that the sides are multiples of `stride`;
    a side may be None (a dynamic-size model).

    For hybrids `stride` is the effective stride (stem stride x patch size).
    """
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or not all((is_int(s) and s > 0) or (s is None and i < 2) for i, s in enumerate(shape)):
        raise ValueError(
            "`input_shape` must be a tuple of 3 positive ints (height, width, "
            "channels); height and width may be None for a model that takes "
            f"any image size. Received: input_shape={input_shape!r}"
        )
    shape = tuple(None if s is None else int(s) for s in shape)
    misfit = any(side is not None and side % step for side, step in zip(shape, stride))
    # Images are channels-last whatever `keras.config.image_data_format()` says.
    channels_first = shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4)
    hint = " Images are (height, width, channels), whatever keras.config.image_data_format() says." * channels_first
    if misfit and stem_stride > 1:
        raise ValueError(
            f"The image height and width must be multiples of the effective "
            f"stride {stride[0]}x{stride[1]} (ResNet stem stride {stem_stride} x "
            f"patch size {patch[0]}x{patch[1]}).{hint} Received: input_shape={shape}"
        )
    if misfit:
        raise ValueError(
            f"The image height and width must be multiples of the patch size "
            f"{stride[0]}x{stride[1]}.{hint} Received: input_shape={shape}"
        )
    return shape


def _stored_size(image_size, input_shape, stride):
    """The `(height, width)` a dynamic-size model stores its position
    embeddings for: `image_size` (int or pair), else 224 for each open side."""
    if image_size is None:
        return tuple(DEFAULT_INPUT_SHAPE[i] if side is None else side for i, side in enumerate(input_shape[:2]))
    size = normalize_pair(image_size, "image_size")
    if any(fixed is not None and fixed != side for fixed, side in zip(input_shape[:2], size)):
        raise ValueError(
            f"`image_size` must agree with the fixed side of `input_shape`. "
            f"Received: image_size={image_size!r}, input_shape={input_shape}"
        )
    if size[0] % stride[0] or size[1] % stride[1]:
        raise ValueError(
            f"`image_size` must be a multiple of {stride[0]}x{stride[1]}, the pixels of one patch (for a "
            f"hybrid: the ResNet stem's stride times the patch size). Received: image_size={image_size!r}"
        )
    return size


def _resolve_fields(variant, overrides):
    if variant is None:
        config_name, fields = None, dict(variants.DEFAULTS)
    else:
        config_name, fields = variants.resolve_variant(variant)
    fields.update(EXTRA_FIELDS)
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise TypeError(
            f"Unknown keyword argument(s) for a ViT model: {unknown}. Accepted: "
            f"{sorted(fields)}. Received: {', '.join(f'{k}={overrides[k]!r}' for k in unknown)}"
        )
    fields.update(overrides)
    # No blocks is not a ViT (and a bool is not a depth).
    fields["num_layers"] = positive_int(fields["num_layers"], "num_layers")
    if fields["classifier"] not in variants.CLASSIFIERS:
        raise ValueError(
            f"`classifier` must be one of {variants.CLASSIFIERS}. "
            f"Received: classifier={fields['classifier']!r}"
        )
    if fields["representation_size"] is not None:
        fields["representation_size"] = positive_int(fields["representation_size"], "representation_size")
    return config_name, fields


def ViT(
    variant=None,
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    num_classes=1000,
    classifier_activation=None,
    name=None,
    posemb_interpolation="linear",
    include_preprocessing=False,
    allow_nonfinite=False,
    remat=False,
    pixel_mean=None,
    pixel_std=None,
    image_size=None,
    **overrides,
):
    """Builds a Vision Transformer (Dosovitskiy et al., ICLR 2021).

    Reference: [An Image is Worth 16x16 Words](https://arxiv.org/abs/2010.11929).
    Layer and weight names follow the original checkpoints
    (google-research/vision_transformer), so its `.npz` files load as they are.

    Args:
        variant: str or None. An original config name (`"ViT-B_16"`,
            `"ViT-B_16-gap-norep"`, `"R50+ViT-B_16"`, `"testing"`, ...), a
            constructor name (`"ViTB16"`), an AugReg name (`"B_16"`,
            `"R26_S_32"`, `"B/16"`, ...: dropout 0) or None for a fully
            custom model built from the keywords below.
        include_top: bool. Whether to add the classification head.
        weights: None, a path to an original `.npz` or a Keras
            `.weights.h5` file, or a registered name (`"imagenet21k"`,
            `"imagenet21k+imagenet2012"`, `"augreg"`, an AugReg file name, ...;
            see `keras_vit.available_weights`).
        input_tensor: optional Keras tensor to use as the image input.
        input_shape: `(height, width, channels)`; the sides must be multiples
            of the patch size (for hybrids: of the ResNet stem's stride times
            the patch size). Defaults to `(224, 224, 3)`. A side set to None
            (`(None, None, 3)`) makes a dynamic-size model: it takes images
            of any size whose sides are such multiples, its position
            embeddings resampled to each image's patch grid inside the graph
            (the numbers of `posemb_interpolation`); a side that is not a
            multiple gets an error at call time naming the size.
        image_size: a dynamic-size model only: the `(height, width)` (or
            one int) its position embeddings are stored for; registered
            `weights` are those of this resolution, and a checkpoint of
            another grid is resampled once into it. Defaults to 224 for each
            open side. At this size the embeddings are used as stored.
        pooling: only with `include_top=False` (refused otherwise): None returns the token sequence
            `(B, T, D)` after `encoder_norm`; `"token"` or `"gap"` (alias
            `"avg"`) the pooled representation (through `pre_logits` when the
            model has a `representation_size`); `"map"` the attention-pooling
            head of a `classifier="map"` model.
        num_classes: int. Classes of the head.
        classifier_activation: None (logits) or an activation such as
            `"softmax"` for the head.
        name: model name. Defaults to the variant's name in snake case.
        posemb_interpolation: `"linear"` (the original's), `"bicubic"` or
            `"bicubic_antialias"` (timm's): how position embeddings of a
            checkpoint at another resolution are resampled.
        include_preprocessing: bool. If True, the model takes raw images
            (uint8 or float pixels in [0, 255]) and applies
            `keras_vit.preprocess_input` inside the graph (a weightless
            `PreprocessInput` layer), so that saved and exported models serve
            raw images.
        pixel_mean, pixel_std: with `include_preprocessing=True`, a
            checkpoint's per-channel mean and std for pixels scaled to
            [0, 1] (timm's convention; `keras_vit.from_timm` sets them from
            the checkpoint's config). None: the original's [-1, 1].
        allow_nonfinite: bool. Load `weights` holding NaN or infinite values
            instead of refusing them (see `keras_vit.load_weights`).
        remat: bool. Gradient checkpointing per encoder block (`keras.remat`):
            training keeps one block's activations instead of all of them,
            for about a third more compute; the same numbers. Kept by
            `.keras` save and load. Defaults to False.
        **overrides: any field of the variant table (`patch_size`,
            `hidden_size`, `mlp_dim`, `num_heads`, `num_layers`,
            `dropout_rate`, `attention_dropout_rate`, `classifier`,
            `representation_size`, `resnet`: residual units per stage of a
            hybrid's ResNet stem, `()` for its root alone) plus
            `drop_path_rate` (stochastic depth, increasing linearly to this
            rate over the blocks), `head_bias_init` (e.g. -10 for sigmoid
            pre-training) and `resnet_width_factor` (hybrids: root width
            `64 * resnet_width_factor`, a multiple of 32). The options of
            later ViT families (docs/models.md), each defaulting to the
            original: `gelu` (`"tanh"`, `"exact"`, `"quick"`),
            `layer_norm_epsilon` (1e-6), `class_token` (None: as the
            `classifier`), `num_register_tokens` (0), `no_embed_class`
            (position embeddings without the prefix tokens' rows, added
            before they are prepended), `layer_scale_init` (LayerScale),
            `pre_norm` (a LayerNorm before the encoder), `fc_norm` (the final
            LayerNorm after pooling), `patch_bias` (True), `qk_norm`
            (False) and `pool_include_prefix` (None: a `"gap"` or `"map"`
            classifier pools the patches only, as timm's; `pooling=` on
            features every token).

    Inputs are NHWC floats in [-1, 1] (see `keras_vit.preprocess_input`), or
    pixels in [0, 255] with `include_preprocessing=True`.

    Returns:
        A functional `keras.Model`.
    """
    config_name, fields = _resolve_fields(variant, overrides)
    include_top = check_bool(include_top, "include_top")
    include_preprocessing = check_bool(include_preprocessing, "include_preprocessing")
    if (pixel_mean is not None or pixel_std is not None) and not include_preprocessing:
        raise ValueError(
            "`pixel_mean` and `pixel_std` set the normalisation of `include_preprocessing=True`. "
            f"Received: pixel_mean={pixel_mean!r}, pixel_std={pixel_std!r} with include_preprocessing=False"
        )
    if pooling not in POOLINGS:
        raise ValueError(f"`pooling` must be one of {POOLINGS}. Received: pooling={pooling!r}")
    if include_top and pooling is not None:
        raise ValueError(
            "`pooling` applies to include_top=False (features without the head); "
            "with include_top=True the model's `classifier` decides the pooling. "
            f"Received: pooling={pooling!r} with include_top=True"
        )
    if include_top:
        num_classes = positive_int(num_classes, "num_classes")
    allow_nonfinite = check_bool(allow_nonfinite, "allow_nonfinite")
    check_interpolation(posemb_interpolation, "posemb_interpolation")
    classifier = fields["classifier"]
    has_class_token = _check_family_options(fields)
    num_prefix_tokens = int(has_class_token) + fields["num_register_tokens"]
    check_gelu(fields["gelu"])
    pool_method = {"avg": "gap"}.get(pooling, pooling)
    if pool_method == "map" and classifier != "map":
        raise ValueError(
            f"`pooling='map'` is the attention-pooling head of a classifier='map' model; this model uses "
            f"classifier={classifier!r}. Received: pooling={pooling!r}"
        )
    if pool_method == "token" and not has_class_token:
        raise ValueError(
            f"`pooling='token'` needs a class token, but this model uses "
            f"classifier={classifier!r}. Use pooling='gap'. Received: pooling={pooling!r}"
        )
    patch = normalize_pair(fields["patch_size"], "patch_size")
    for rate in ("dropout_rate", "attention_dropout_rate", "drop_path_rate"):
        check_rate(fields[rate], rate)
    # Hybrids: a ResNet stem in front of the patch embedding (paper Sec. 3.1).
    stem_stride = 1
    if fields["resnet"] is not None:
        fields["resnet"], _ = resnet_lib.check_resnet(
            fields["resnet"], fields["resnet_width_factor"]
        )
        stem_stride = resnet_lib.stem_stride(fields["resnet"])
    elif fields["resnet_width_factor"] != 1:
        raise ValueError(
            "`resnet_width_factor` only applies to hybrid models (`resnet` set). "
            f"Received: resnet_width_factor={fields['resnet_width_factor']!r}"
        )

    # --- Input ---
    # Pixels per token: the patch, times the ResNet stem's stride for hybrids.
    stride = (stem_stride * patch[0], stem_stride * patch[1])
    if input_tensor is not None:
        tensor_shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and _check_input_shape(input_shape, stride, stem_stride, patch) != tensor_shape:
            raise ValueError(
                "`input_shape` must be the shape of `input_tensor` (without the batch), or None. "
                f"Received: input_shape={tuple(input_shape)!r}, input_tensor of shape {tensor_shape}"
            )
        input_shape = tensor_shape
    input_shape = _check_input_shape(DEFAULT_INPUT_SHAPE if input_shape is None else input_shape, stride,
                                     stem_stride, patch)
    dynamic = None in input_shape[:2]
    if dynamic:
        stored = _stored_size(image_size, input_shape, stride)
    elif image_size is not None:
        raise ValueError(
            "`image_size` sets the stored resolution of a dynamic-size model (an `input_shape` side "
            f"set to None); this model's input is fixed. Received: image_size={image_size!r}, "
            f"input_shape={input_shape}"
        )
    if include_preprocessing and pixel_mean is not None and input_shape[2] != 3:
        raise ValueError(
            "`pixel_mean` and `pixel_std` hold 3 per-channel values; the model's images have "
            f"{input_shape[2]} channels. Received: input_shape={input_shape}"
        )
    if input_tensor is None:
        inputs = keras.Input(shape=input_shape, name="images")
    elif keras.backend.is_keras_tensor(input_tensor):
        inputs = input_tensor
    else:
        inputs = keras.Input(tensor=input_tensor, shape=input_shape, name="images")

    # --- Embedding: patches, [class] token, position embedding ---
    x = inputs
    # A side given as None takes any multiple of the stride; a fixed side its own size only.
    x = vit_layers.ImageSizeCheck(stride, image_size=input_shape[:2], name="image_size_check")(x)
    if include_preprocessing:
        x = vit_layers.PreprocessInput(pixel_mean, pixel_std, name="preprocess_input")(x)
    if fields["resnet"] is not None:
        x = resnet_lib.resnet_stem(x, fields["resnet"], fields["resnet_width_factor"])
    x = vit_layers.PatchEmbedding(
        fields["hidden_size"], patch, use_bias=fields["patch_bias"], name="embedding"
    )(x)

    def add_position_embedding(x, prefix):
        if not dynamic:
            return vit_layers.AddPositionEmbedding(name="posembed_input")(x)
        return vit_layers.AddPositionEmbedding(
            grid=(stored[0] // stride[0], stored[1] // stride[1]), stride=stride, num_prefix_tokens=prefix,
            interpolation=posemb_interpolation, name="posembed_input")(x, inputs)

    if fields["no_embed_class"]:
        x = add_position_embedding(x, 0)
    # Order [class, registers, patches], as timm's.
    if fields["num_register_tokens"]:
        x = vit_layers.ClassToken(num_tokens=fields["num_register_tokens"], name="registers")(x)
    if has_class_token:
        x = vit_layers.ClassToken(name="cls")(x)
    if not fields["no_embed_class"]:
        x = add_position_embedding(x, num_prefix_tokens)
    x = keras.layers.Dropout(fields["dropout_rate"], name="dropout")(x)
    norm_epsilon = fields["layer_norm_epsilon"]
    if fields["pre_norm"]:
        x = keras.layers.LayerNormalization(epsilon=norm_epsilon, name="pre_norm")(x)

    # --- Encoder ---
    num_layers = fields["num_layers"]
    for i in range(num_layers):
        # Stochastic depth increasing linearly with depth (AugReg, after
        # Huang et al. 2016); 0 everywhere by default, as in the paper.
        drop_path = fields["drop_path_rate"] * i / max(num_layers - 1, 1)
        x = vit_layers.TransformerEncoderBlock(
            num_heads=fields["num_heads"],
            mlp_dim=fields["mlp_dim"],
            dropout_rate=fields["dropout_rate"],
            attention_dropout_rate=fields["attention_dropout_rate"],
            drop_path_rate=drop_path,
            layer_norm_epsilon=norm_epsilon,
            gelu=fields["gelu"],
            layer_scale_init=fields["layer_scale_init"],
            qk_norm=fields["qk_norm"],
            remat=remat,
            name=f"encoderblock_{i}",
        )(x)
    if not fields["fc_norm"]:
        x = keras.layers.LayerNormalization(epsilon=norm_epsilon, name="encoder_norm")(x)

    def pool(x, method):
        include = fields["pool_include_prefix"]
        if include is None:
            include = not include_top
        skipped = pooled_prefix_tokens(method, include, num_prefix_tokens)
        if method == "map":
            x = vit_layers.AttentionPooling(
                fields["num_heads"], fields["mlp_dim"], gelu=fields["gelu"], layer_norm_epsilon=norm_epsilon,
                num_prefix_tokens=skipped, name="map_head")(x)
        else:
            x = vit_layers.SequencePooling(method, skipped, name="pool")(x)
        if fields["fc_norm"]:
            x = keras.layers.LayerNormalization(epsilon=norm_epsilon, name="fc_norm")(x)
        return _pre_logits(x, fields["representation_size"])

    # --- Head ---
    if include_top:
        if classifier in ("token", "gap", "map"):
            x = pool(x, classifier)
        else:
            x = _pre_logits(x, fields["representation_size"])
        x = keras.layers.Dense(
            num_classes,
            activation=classifier_activation,
            kernel_initializer="zeros",
            bias_initializer=keras.initializers.Constant(fields["head_bias_init"]),
            dtype=head_dtype(x.dtype),  # float32 under mixed precision
            name="head",
        )(x)
    elif pool_method is not None:
        x = pool(x, pool_method)

    if name is None:
        name = variants.model_name(config_name) if config_name else "vit"
    model_inputs = (
        inputs if input_tensor is None else keras.utils.get_source_inputs(inputs)
    )
    model = ViTModel(model_inputs, x, name=name)

    if weights is not None:
        load_weights(
            model,
            weights,
            variant=config_name,
            interpolation=posemb_interpolation,
            allow_nonfinite=allow_nonfinite,
        )
    return model


def _check_family_options(fields):
    """Whether the model has a class token: `class_token`, or (None) the
    `classifier`'s need; the options that depend on it checked."""
    token_classifier = fields["classifier"] in ("token", "token_unpooled")
    has = fields["class_token"]
    if has is None:
        has = token_classifier
    if not isinstance(has, bool):
        raise ValueError(f"`class_token` must be None or a bool. Received: class_token={has!r}")
    if token_classifier and not has:
        raise ValueError(
            f"classifier={fields['classifier']!r} pools the class token; a model without one pools with "
            "classifier='gap'. Received: class_token=False"
        )
    registers = fields["num_register_tokens"]
    if not is_int(registers) or registers < 0:
        raise ValueError(
            f"`num_register_tokens` must be an int >= 0. Received: num_register_tokens={registers!r}"
        )
    for name in ("no_embed_class", "pre_norm", "fc_norm", "patch_bias", "qk_norm"):
        fields[name] = check_bool(fields[name], name)
    if fields["pool_include_prefix"] not in (None, True, False):
        raise ValueError("`pool_include_prefix` must be None or a bool. "
                         f"Received: pool_include_prefix={fields['pool_include_prefix']!r}")
    bias = fields["head_bias_init"]
    if not is_real(bias):
        raise ValueError(f"`head_bias_init` must be a finite real number. Received: head_bias_init={bias!r}")
    fields["head_bias_init"] = float(bias)
    epsilon = fields["layer_norm_epsilon"]
    if not is_real(epsilon) or not epsilon > 0:
        raise ValueError(f"`layer_norm_epsilon` must be a positive float. Received: layer_norm_epsilon={epsilon!r}")
    return has


def _pre_logits(x, representation_size):
    # The pre-training head's hidden layer: Dense + tanh (paper App. D.3).
    if representation_size is None:
        return x
    return keras.layers.Dense(
        representation_size, activation="tanh", kernel_initializer="lecun_normal",
        name="pre_logits",
    )(x)


_CONSTRUCTOR_DOC = """Builds {config} ({size}).

Thin wrapper over `keras_vit.ViT("{config}", ...)`; every argument of `ViT`
is accepted, and a keyword overrides the variant's table value.

Example:

```python
model = keras_vit.{function}(num_classes=10, input_shape=(384, 384, 3),
                             weights="imagenet21k")
```
"""


def _make_constructor(config_name, function_name):
    def constructor(
        include_top=True,
        weights=None,
        input_tensor=None,
        input_shape=None,
        pooling=None,
        num_classes=1000,
        classifier_activation=None,
        name=None,
        include_preprocessing=False,
        **kwargs,
    ):
        return ViT(
            config_name,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            num_classes=num_classes,
            classifier_activation=classifier_activation,
            name=name,
            include_preprocessing=include_preprocessing,
            **kwargs,
        )

    fields = variants.VARIANTS[config_name]
    size = (
        f"patch {fields['patch_size']}, width {fields['hidden_size']}, "
        f"{fields['num_layers']} blocks, {fields['num_heads']} heads"
    )
    if fields.get("resnet") is not None:
        size = (
            f"ResNet stem with stages {fields['resnet']} (stride "
            f"{resnet_lib.stem_stride(fields['resnet'])}), {size}"
        )
    constructor.__name__ = constructor.__qualname__ = function_name
    constructor.__doc__ = _CONSTRUCTOR_DOC.format(
        config=config_name, function=function_name, size=size
    )
    return constructor


# `keras_vit.ViTB16`, ...: one function per row of `variants.CONSTRUCTORS`.
for _function_name, _config_name in variants.CONSTRUCTORS.items():
    globals()[_function_name] = _make_constructor(_config_name, _function_name)
del _function_name, _config_name

__all__ = ["ViT", "get_model", *variants.CONSTRUCTORS]


def get_model(variant, /, **kwargs):
    """Builds a model from an original config, constructor or AugReg name.

    `get_model("ViT-B_16")`, `get_model("ViTB16")`, `get_model("ViT-B_16-gap-norep")`,
    `get_model("testing")`, `get_model("B_16", weights="augreg")`,
    `get_model("R50+ViT-B_16")`, `get_model("R26_S_32")`; keyword arguments as
    `ViT` (`name=` names the Keras model).
    """
    return ViT(variant, **kwargs)
