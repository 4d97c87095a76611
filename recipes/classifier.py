"""Training a classifier from pre-trained weights: what fine-tuning
(`recipes/finetune.py`) and each VTAB task (`recipes/vtab.py`) share, so
that no recipe imports another.

The model at the target resolution with its loaded weights and a zero head
(`build_model`), the paper's fine-tuning optimizer (`make_optimizer`), the
optional Keras batch augmentation (`augmentation_layers`) and one resumable
run on prepared data (`fit_one`). Keras is imported inside the functions.
"""

import json

from recipes import cli
from recipes import run as skeleton


def build_model(config, num_classes):
    """The model at the target resolution with the pre-trained weights.

    `keras_vit.load_weights` resamples the position embeddings to the new
    grid and re-initialises a head of another size; with `reset_head` the
    head is zeroed in any case (paper Sec. 3.2: "we remove the pre-trained
    prediction head and attach a zero-initialized D x K feedforward layer").

    Returns:
        `(model, notes)`: an uncompiled model and the loader's notes (what
        was resampled, dropped or re-initialised).
    """
    import keras_vit

    size = config.image_size
    model = skeleton.build_vit(config, num_classes=num_classes, input_shape=(size, size, 3))
    notes = []
    if config.weights:
        try:
            notes = list(keras_vit.load_weights(model, config.weights, variant=skeleton.check_model(config)))
        except (ValueError, OSError) as error:
            raise cli.RecipeError(f"--weights={config.weights}: {error}") from None
    if config.reset_head:
        # The builder's layers are kept (pre_logits too, when configured).
        model = keras_vit.reset_head(
            model, num_classes, keep_pre_logits=True,
            bias=config.model_overrides.get("head_bias_init", 0.0),
        )
        notes.append("head: zero-initialised for fine-tuning.")
    if getattr(config, "linear_probe", False):
        keras_vit.freeze_backbone(model)
        notes.append("backbone frozen: only the head trains (linear probe).")
    return model, notes


def _layer_class(name, flag):
    import keras

    cls = getattr(keras.layers, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, keras.layers.Layer)):
        raise cli.RecipeError(
            f"{flag}: unknown Keras layer {name!r} (a class of keras.layers, e.g. RandAugment, MixUp, CutMix)"
        )
    return cls


def augmentation_layers(text):
    """`--batch_augmentation` as a list of Keras layers, or None (off).

    `text`: comma-separated names of `keras.layers` classes, built with their
    default arguments (`RandAugment,MixUp`), or a JSON list of serialized
    layers: `{"class_name": ..., "config": {...}}` names a `keras.layers`
    class; an entry with a `"module"` (`keras.saving.serialize_keras_object`'s
    output, e.g. a registered custom layer) is deserialized as Keras does.
    """
    if text is None:
        return None
    import keras

    flag = f"--batch_augmentation={text}"
    if text.lstrip().startswith("["):
        try:
            specs = json.loads(text)
        except json.JSONDecodeError as error:
            raise cli.RecipeError(f"{flag}: not a JSON list ({error})") from None
    else:
        specs = [{"class_name": name.strip()} for name in text.split(",") if name.strip()]
    layers = []
    for spec in specs:
        if not (isinstance(spec, dict) and "class_name" in spec):
            raise cli.RecipeError(
                f'{flag}: each entry must be {{"class_name": ..., "config": {{...}}}}. Received: {json.dumps(spec)}'
            )
        if "module" in spec:
            build = lambda spec=spec: keras.saving.deserialize_keras_object(spec)  # noqa: E731
        else:
            cls = _layer_class(spec["class_name"], flag)
            # float32 pixels whatever --dtype_policy says (the pipeline requires it).
            config = {"dtype": "float32", **(spec.get("config") or {})}
            build = lambda cls=cls, config=config: cls.from_config(config)  # noqa: E731
        try:
            layers.append(build())
        except (TypeError, ValueError) as error:
            raise cli.RecipeError(f"{flag}: {error}") from None
    return layers or None


def make_optimizer(config):
    from keras_vit import training

    accum = config.accum_steps
    return training.finetuning_optimizer(
        config.learning_rate,
        config.total_steps,
        warmup_steps=config.warmup_steps,
        decay_type=config.decay_type,
        momentum=config.momentum,
        global_clipnorm=config.grad_clip,
        accumulator_dtype=config.accumulator_dtype,
        gradient_accumulation_steps=accum if accum > 1 else None,
    )


def fit_one(config, *, run_dir, setup, train_data, eval_data, num_classes, eval_label="the test split",
            header=(), callbacks=(), save_model=True):
    """One fine-tuning run on prepared data.

    Args:
        config: a `FinetuneConfig` or `VtabConfig` (model, weights,
            image_size, optimizer, steps, batch sizes).
        run_dir: where this run writes (resumable).
        setup: a `keras_vit.distribute.DistributionSetup`.
        train_data: `(batch_size) -> tf.data.Dataset`, repeating.
        eval_data: `(batch_size) -> tf.data.Dataset`, one pass, or None.
        num_classes: int.
    """
    from keras_vit import training

    def build():
        model, notes = build_model(config, num_classes)
        skeleton.compile_model(model, make_optimizer(config), training.SoftmaxCrossEntropy(), config)
        return model, notes

    return skeleton.train_and_evaluate(
        config, run_dir=run_dir, setup=setup, build=build, train_data=train_data, eval_data=eval_data,
        eval_label=eval_label, header=header, callbacks=callbacks,
        save=skeleton.save_classifier if save_model else None,
    )
