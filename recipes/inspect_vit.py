"""Writes the paper's inspection figures (Fig. 6 and 7) for one model.

Attention rollout on a few images (Figure 6), position-embedding similarity
(Figure 7 centre), principal components of the RGB embedding filters
(Figure 7 left; plain ViTs only) and mean attention distance per head over
all images (Figure 7 right), plus the arrays behind them (`inspect.npz`) and
`summary.json`, into `--out`.

    # An original checkpoint (ImageNet-21k pre-trained, ImageNet fine-tuned, 384 px):
    python -m recipes.inspect_vit --model ViT-B_16 --weights imagenet21k+imagenet2012 \\
        --input-size 384 --images path/to/images --out runs/inspect_b16

    # A model fine-tuned and saved with keras_vit (a `.keras` file):
    python -m recipes.inspect_vit --model runs/finetune/model.keras \\
        --images path/to/images --out runs/inspect_finetuned

See docs/inspect.md.
"""

import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Write the ViT paper's inspection figures (attention rollout, "
        "position-embedding similarity, embedding filters, attention distance).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--model", default="ViT-B_16",
        help="an original config name (ViT-B_16, R50+ViT-B_16, ViT-B_16-gap-norep, ...), "
        "an AugReg name (B_16, R26_S_32, ...) or a saved `.keras` model file",
    )
    parser.add_argument(
        "--weights", default=None,
        help="an original .npz, a registered name (imagenet21k, imagenet21k+imagenet2012, "
        "augreg, ...) or a .weights.h5 file; omit for random weights (figures of an "
        "untrained model)",
    )
    parser.add_argument(
        "--num-classes", type=int, default=None,
        help="with a .weights.h5 file: the classes of the saved model's head",
    )
    parser.add_argument(
        "--input-size", type=int, nargs="+", default=None, metavar="PIXELS",
        help="model input size: one int (square) or height width; defaults to 224, "
        "or the saved model's size",
    )
    parser.add_argument("--images", required=True, help="a folder of images (sub-folders searched)")
    parser.add_argument("--out", required=True, help="the run directory to write into")
    parser.add_argument(
        "--max-images", type=int, default=128,
        help="images used for the attention distance (the paper used 128)",
    )
    parser.add_argument("--rollout-images", type=int, default=4, help="images shown in the rollout figure")
    parser.add_argument("--components", type=int, default=28, help="principal components of the filters")
    parser.add_argument("--format", default="png", choices=("png", "svg", "pdf"))
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    if args.input_size is not None and len(args.input_size) not in (1, 2):
        parser.error(f"--input-size takes one or two ints. Received: {args.input_size}")
    return args


def build_model(args):
    import keras

    import keras_vit

    if args.model.endswith(".keras"):
        if args.weights is not None or args.input_size is not None:
            raise SystemExit("--weights and --input-size do not apply to a saved .keras model.")
        return keras.saving.load_model(args.model)
    size = args.input_size or [224]
    input_shape = (size[0], size[-1], 3)
    weights = args.weights
    if weights is not None and weights.endswith(".weights.h5"):
        if args.num_classes is None:
            raise SystemExit("A .weights.h5 file needs --num-classes (the saved head's classes).")
        return keras_vit.get_model(
            args.model, input_shape=input_shape, num_classes=args.num_classes, weights=weights
        )
    # The head plays no part in the figures; a checkpoint's head is dropped.
    return keras_vit.get_model(args.model, input_shape=input_shape, include_top=False, weights=weights)


def main(argv=None):
    args = parse_args(argv)
    import keras_vit
    from keras_vit import inspect as vit_inspect

    model = build_model(args)
    geometry = vit_inspect.geometry(model)
    uint8, names = vit_inspect.load_image_folder(args.images, geometry.image_size, args.max_images)
    if args.weights is None and not args.model.endswith(".keras"):
        print("No --weights: the figures show an untrained (randomly initialised) model.")
    written = vit_inspect.write_figures(
        model,
        keras_vit.preprocess_input(uint8),
        args.out,
        image_format=args.format,
        rollout_images=min(args.rollout_images, len(uint8)),
        num_components=args.components,
        titles=names,
        batch_size=args.batch_size,
    )
    print(
        f"{model.name}: {len(uint8)} image(s), grid {geometry.grid[0]}x{geometry.grid[1]}, "
        f"patches of {geometry.patch_size[0]}x{geometry.patch_size[1]} pixels"
        f"{' (hybrid)' if geometry.hybrid else ''}"
    )
    for name, path in written.items():
        print(f"  {name}: {path}")
    return written


if __name__ == "__main__":
    main()
