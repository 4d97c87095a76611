"""Writes the paper's inspection figures (Fig. 6 and 7) for one model.

Attention rollout on a few images (Figure 6), position-embedding similarity
(Figure 7 centre), principal components of the RGB embedding filters
(Figure 7 left; plain ViTs only) and mean attention distance per head over
all images (Figure 7 right), plus the arrays behind them (`inspect.npz`) and
`summary.json`, into `--run_dir`.

    # An original checkpoint (ImageNet-21k pre-trained, ImageNet fine-tuned, 384 px):
    python -m recipes.inspect_vit --model=ViT-B_16 --weights=imagenet21k+imagenet2012 \\
        --image_size=384 --images=path/to/images --run_dir=runs/inspect_b16
    # A model fine-tuned and saved with keras_vit (a `.keras` file):
    python -m recipes.inspect_vit --model=runs/finetune/cifar10/model.keras \\
        --images=path/to/images --run_dir=runs/inspect_finetuned
    # Seconds: a tiny random model on generated images.
    python -m recipes.inspect_vit --smoke --run_dir=runs/inspect_smoke

See docs/inspect.md.
"""

import os
import tempfile

from recipes import checks
from recipes import cli
from recipes import rundir
from recipes.configs import SMOKE_MODEL
from recipes.configs import InspectConfig
from recipes.configs import Named
from recipes.configs import Recipe

RECIPE = Recipe(
    "inspect_vit", "Inspection", InspectConfig, base={},
    smoke=dict(model="none", model_overrides=dict(SMOKE_MODEL), weights=None, image_size=(16, 24), max_images=4,
               rollout_images=2, components=4),
    configs={"default": Named(
        "figures of an original checkpoint fine-tuned on ImageNet at 384 px", {},
        "the paper's Figure 7 patterns (docs/inspect.md): position embeddings similar along rows and columns, "
        "attention distances that grow with depth",
        "--weights=imagenet21k+imagenet2012 --image_size=384 --images=path/to/images --run_dir=runs/inspect_b16")})


def _expected(what):
    """A failure of the user's input (weights, model file, images) as one
    `error:` line."""
    return lambda error: cli.RecipeError(f"{what}: {error}")


def build_model(config):
    import keras

    import keras_vit

    if config.model.endswith(".keras"):
        if config.weights is not None or config.image_size is not None:
            raise cli.RecipeError("--weights and --image_size do not apply to a saved .keras model.")
        if not os.path.isfile(config.model):
            raise cli.RecipeError(f"no file {config.model} (--model).")
        try:
            return keras.saving.load_model(config.model)
        except (ValueError, OSError) as error:
            raise _expected(f"--model={config.model}")(error) from None
    size = config.image_size or (224,)
    if len(size) not in (1, 2):
        raise cli.RecipeError(f"--image_size takes one or two ints. Received: --image_size={cli.show(size)}")
    reserved = sorted(set(config.model_overrides) & {"input_shape", "input_tensor", "include_top", "weights",
                                                      "num_classes"})
    if reserved:
        raise cli.RecipeError(f"--model_overrides cannot set {', '.join(reserved)}: the recipe sets them from "
                              "--image_size, --weights and --num_classes.")
    kwargs = dict(config.model_overrides, input_shape=(size[0], size[-1], 3), weights=config.weights)
    variant = None if config.model.lower() in cli.NONE else config.model
    weights = config.weights
    if weights is not None and weights.endswith(".weights.h5"):
        if config.num_classes is None:
            raise cli.RecipeError("a .weights.h5 file needs --num_classes (the saved head's classes).")
        kwargs["num_classes"] = config.num_classes
    else:
        # The head plays no part in the figures; a checkpoint's head is
        # dropped. Its pooling stays: rollout starts from what the head reads
        # (a gap model with a class token started from the class token).
        kwargs["include_top"] = False
    try:
        if not kwargs.get("include_top", True):
            fields = keras_vit.variants.resolve_variant(variant)[1] if variant else keras_vit.variants.DEFAULTS
            classifier = config.model_overrides.get("classifier", fields["classifier"])
            kwargs.setdefault("pooling", classifier if classifier in ("token", "gap", "map") else None)
        return keras_vit.ViT(variant, **kwargs)
    except (ValueError, OSError, TypeError) as error:  # TypeError: an unknown --model_overrides key
        raise _expected(f"--model={config.model}, --weights={weights}")(error) from None


def load_images(config, size, directory):
    from keras_vit import inspect as vit_inspect

    try:
        return vit_inspect.load_image_folder(directory, size, config.max_images)
    except (ValueError, OSError) as error:  # the library's error names the file
        raise cli.RecipeError(f"--images={directory}: {error}") from None


def run(config, config_name=None, smoke=False):
    checks.check_fields(config)
    if config.images is None and not smoke:
        raise cli.RecipeError("give --images: a folder of images (or --smoke).")
    # A run directory as every recipe's: never another run's, nor a live one.
    with rundir.open_run("inspect_vit", config, config_name):
        return _inspect(config, smoke)


def _inspect(config, smoke):
    import keras

    import keras_vit
    from keras_vit import inspect as vit_inspect

    keras.utils.set_random_seed(config.seed)
    model = build_model(config)
    try:
        geometry = vit_inspect.geometry(model)
    except ValueError as error:
        raise _expected(f"--model={config.model}")(error) from None
    # The images the model takes: its input's size (before a crop or a
    # resize it may start with), RGB.
    height, width, channels = model.inputs[0].shape[1:]
    size = (height, width) if height and width else geometry.image_size
    if channels != 3:
        raise cli.RecipeError(f"the recipe reads RGB images; --model={config.model} takes {channels} channel(s) "
                              "(keras_vit.inspect.write_figures takes your own arrays).")
    with tempfile.TemporaryDirectory(prefix="keras_vit_inspect_") as generated:
        directory = config.images
        if directory is None:  # --smoke: a few random-pixel images.
            from keras_vit.data.testing import smoke_images

            directory = smoke_images(generated, size, seed=config.seed)
        pixels, names = load_images(config, size, directory)
    if config.weights is None and not config.model.endswith(".keras"):
        print("No --weights: the figures show an untrained (randomly initialised) model.")
    written = vit_inspect.write_figures(
        model,
        # Pixels for a model that preprocesses them itself.
        pixels if vit_inspect.takes_pixels(model) else keras_vit.preprocess_input(pixels),
        config.run_dir,
        image_format=config.format,
        rollout_images=min(config.rollout_images, len(pixels)),
        num_components=config.components,
        titles=names,
        batch_size=config.batch_size,
    )
    print(
        f"{model.name}: {len(pixels)} image(s), grid {geometry.grid[0]}x{geometry.grid[1]}, "
        f"patches of {geometry.patch_size[0]}x{geometry.patch_size[1]} pixels"
        f"{' (hybrid)' if geometry.hybrid else ''}"
    )
    for name, path in written.items():
        print(f"  {name}: {path}")
    return written


parse, main = cli.entry_points(RECIPE, run, prog="python -m recipes.inspect_vit",
                               description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    cli.run_command(main)
