"""keras_vit models of timm checkpoints (the Hugging Face Hub's ViT weights)."""

import keras

from keras_vit.layers.patch_embedding import ImageSizeCheck
from keras_vit.layers.position_embedding import check_interpolation
from keras_vit.layers.utils import check_bool, normalize_pair, positive_int
from keras_vit.models.vit import ViT
from keras_vit.weights import hub
from keras_vit.weights import timm as timm_format


def from_timm(
    source,
    num_classes=None,
    input_shape=None,
    include_top=True,
    pooling="default",
    include_preprocessing=False,
    posemb_interpolation="bicubic_antialias",
    revision=None,
    token=None,
    cache_dir=None,
    local_files_only=False,
    name=None,
    **kwargs,
):
    """Builds the keras_vit model of a timm ViT checkpoint and loads it.

    The architecture, image size, classes, pooling and normalisation come
    from the checkpoint's own `config.json` (timm's `architecture`,
    `model_args` and `pretrained_cfg`); an architecture or option keras_vit
    cannot express is refused, naming it, before the weights are
    downloaded. Logits and features equal timm's (docs/weights.md lists the
    families), at any `input_shape`; another `patch_size` is PI-resized as
    big_vision does, not as timm's loader.

    Args:
        source: a Hub repository, `"hf-hub:timm/NAME"`, `"timm/NAME"` or the
            timm name with its tag (`"vit_base_patch16_224.augreg2_in21k_ft_in1k"`),
            fetched through `huggingface_hub` (its cache, `HF_HUB_OFFLINE`,
            `HF_TOKEN`), or a local directory with `config.json` and
            `model.safetensors`. Only safetensors are read.
        num_classes: classes of the head. None: the checkpoint's. Another
            number gets a zero-initialised head (paper Sec. 3.2).
        input_shape: `(height, width, 3)`; default the checkpoint's size. The
            position embeddings are resampled to another grid. Pixels past
            the last whole patch are dropped, as timm does (SigLIP
            so400m/14 at 384 px sees 378). `(None, None,
            3)`: a dynamic-size model storing the checkpoint's embeddings,
            resampled to each input's grid with `posemb_interpolation`.
        include_top: with the head (a checkpoint without one, such as DINOv2's,
            needs `num_classes`).
        pooling: with `include_top=False`: `"default"` the checkpoint's own
            pooling (its pre-logit features), None the token sequence, or
            `"token"`, `"gap"`, `"map"` as `keras_vit.ViT`.
        include_preprocessing: take raw pixels in [0, 255], normalised with the
            checkpoint's mean and std inside the model.
        posemb_interpolation: `"bicubic_antialias"` (timm's), `"bicubic"` or
            `"linear"`.
        revision, token, cache_dir, local_files_only: `huggingface_hub`'s.
        name: the Keras model's name.
        **kwargs: further `keras_vit.ViT` keywords (`dropout_rate`,
            `drop_path_rate`, `remat`, ...); they win over the checkpoint's
            config (e.g. `gelu="quick"` for OpenAI's CLIP weights, whose
            timm config names the exact GELU).

    Returns:
        A functional `keras.Model`. The checkpoint's config (its
        `pretrained_cfg`: resize, crop, interpolation for evaluation) is
        `keras_vit.weights.hub.fetch(source, config_only=True)[0]`.
    """
    include_top = check_bool(include_top, "include_top")
    include_preprocessing = check_bool(include_preprocessing, "include_preprocessing")
    local_files_only = check_bool(local_files_only, "local_files_only")
    check_interpolation(posemb_interpolation, "posemb_interpolation")  # also when nothing is resampled
    if num_classes is not None:
        num_classes = positive_int(num_classes, "num_classes")
    # The weights are loaded from the config's commit (`revision` pinned).
    config, _, where, revision = hub.fetch_commit(source, revision, token, cache_dir, local_files_only,
                                                  config_only=True)
    try:
        args, pretrained = timm_format.config_args(config)
        builder = timm_format.builder_kwargs(args)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    checkpoint_classes = builder.pop("num_classes", 0)
    checkpoint_pooling = builder.pop("pooling", None)
    builder.pop("include_top")
    if input_shape is not None:
        if isinstance(input_shape, (tuple, list)) and None in tuple(input_shape)[:2]:
            # A dynamic-size model keeps the checkpoint's embeddings (resampled
            # once along a fixed side) and resamples them in its graph as timm would.
            # (The sides the checkpoint's patches cover: timm drops the rest.)
            patch = normalize_pair(kwargs.get("patch_size", builder["patch_size"]), "patch_size")
            stored = zip(tuple(input_shape)[:2], builder["input_shape"][:2], patch)
            builder.update(image_size=tuple(side if side is not None else checkpoint - checkpoint % step
                                            for side, checkpoint, step in stored),
                           posemb_interpolation=posemb_interpolation)
        builder["input_shape"] = input_shape
    if include_top:
        classes = checkpoint_classes if num_classes is None else num_classes
        if not classes:
            raise ValueError(f"{where} has no classification head (a feature extractor): pass num_classes, or "
                             "include_top=False for its features. Received: num_classes=None")
        builder.update(include_top=True, num_classes=classes)
    else:
        if pooling == "default":
            # The checkpoint's pre-logit features: its head's pooling.
            pooling = builder["classifier"] if checkpoint_classes else checkpoint_pooling
        builder.update(include_top=False, pooling=pooling)
    if include_preprocessing:
        builder.update(include_preprocessing=True, pixel_mean=pretrained.get("mean", (0.5,) * 3),
                       pixel_std=pretrained.get("std", (0.5,) * 3))
    options = {**builder, **kwargs}
    _crop_uncovered_pixels(options)
    model = ViT(None, name=name or _model_name(config["architecture"]), **options)
    # The model is the config's, but for the keywords given here on purpose
    # (e.g. gelu="quick" for OpenAI's CLIP weights).
    hub.load_timm(model, where, posemb_interpolation, revision, token, cache_dir, local_files_only,
                  check_numerics=False)
    return model


def _crop_uncovered_pixels(options):
    """timm's patch convolution drops the pixels past the last whole patch
    (SigLIP so400m/14 at 384 px: 27 patches cover 378); keras_vit refuses
    partial patches, so a fixed size that has them gets a model cropping
    them first, as timm's result is."""
    shape = options["input_shape"]
    if options.get("input_tensor") is not None or not isinstance(shape, (tuple, list)) or None in tuple(shape)[:2]:
        return
    patch = normalize_pair(options["patch_size"], "patch_size")
    height, width = (int(side) for side in tuple(shape)[:2])
    rows, cols = height % patch[0], width % patch[1]
    if not (rows or cols) or height < patch[0] or width < patch[1]:
        return
    images = keras.Input((height, width, *tuple(shape)[2:]), name="images")
    # The size is checked before the crop, so that an error names the size the model takes.
    checked = ImageSizeCheck((1, 1), image_size=(height, width), name="timm_image_size_check")(images)
    cropped = keras.layers.Cropping2D(((0, rows), (0, cols)), data_format="channels_last",
                                        name=timm_format.CROP_LAYER)(checked)
    options.update(input_shape=(height - rows, width - cols, *tuple(shape)[2:]), input_tensor=cropped)


def _model_name(architecture):
    return "".join(c if c.isalnum() else "_" for c in architecture.lower())
