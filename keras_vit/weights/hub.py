"""timm checkpoints from the Hugging Face Hub or a local directory, and back.

The Hub is reached through `huggingface_hub` itself (its cache, revisions,
tokens for gated repositories, `HF_HUB_OFFLINE`), and
only `safetensors` files are read: PyTorch's `.bin`/`.pth` files are pickles,
which can run code when loaded, and are refused. Both packages are the
optional extra `hub` (`pip install -e ".[hub]"` from a clone).
"""

import hashlib
import json
import logging
import os
import re

import numpy as np

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# The pickled weight files timm also publishes (timm/models/_hub.py).
PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model.pth", "model.pth", "open_clip_pytorch_model.bin")
HUB_PREFIX = "hf-hub:"
logger = logging.getLogger("keras_vit")


def _require(module):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ImportError(
            f"Reading or writing timm checkpoints needs the `{module.split('.')[0]}` package: "
            "pip install huggingface_hub safetensors (the `hub` extra)."
        ) from None


def hub_repo(source):
    """The Hub repository of a `source` that names one: `"hf-hub:timm/NAME"`,
    `"timm/NAME"` or a bare timm name with its tag (`"NAME.TAG"`,
    e.g. `vit_base_patch16_224.augreg2_in21k_ft_in1k`), each may end in
    `@REVISION` as timm writes it (`fetch` splits it off); None for a local
    path."""
    source = os.fspath(source)
    if source.startswith(HUB_PREFIX):
        return source[len(HUB_PREFIX):]
    if os.path.exists(os.path.expanduser(source)):
        return None
    if source.count("/") == 1 and not source.startswith((".", "/", "~")):
        return source
    if "/" not in source and "." in source:
        return f"timm/{source}"
    return None


def read_safetensors(path):
    """`{key: numpy array}` of a safetensors file; a damaged or truncated
    file is a ValueError naming it."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"Weights file not found. Received: {path}")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a safetensors file. Received: {path}")
    numpy_io = _require("safetensors.numpy")
    try:
        arrays = numpy_io.load_file(path)
        # bfloat16 (the Hub's usual half precision) comes as ml_dtypes'
        # type, which numpy does not count as a float: float32, exactly.
        return {key: value.astype(np.float32) if value.dtype.name == "bfloat16" else value
                for key, value in arrays.items()}
    except Exception as error:  # safetensors raises its own error types
        # In the Hugging Face cache the path is a link to a blob, which the
        # client links again as it is: the blob is what to delete.
        real = os.path.realpath(path)
        where = path if real == os.path.abspath(path) else f"{real} (the file {path} links to)"
        raise ValueError(
            f"{path} is not a readable safetensors file ({type(error).__name__}: {error}); a download may "
            f"have been cut short: delete {where} and load again. Received: {path}"
        ) from None


def _read_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not a readable timm config.json ({error}). Received: {path}") from None


def _local(directory):
    config = os.path.join(directory, CONFIG_NAME)
    weights = os.path.join(directory, WEIGHTS_NAME)
    if not os.path.exists(weights):
        pickles = [name for name in PICKLE_NAMES if os.path.exists(os.path.join(directory, name))]
        if pickles:
            raise ValueError(_pickle_message(directory, pickles))
        raise ValueError(f"{directory} has no {WEIGHTS_NAME}. Received: {directory}")
    if not os.path.exists(config):
        raise ValueError(f"{directory} has no {CONFIG_NAME} (timm's description of the model). Received: {directory}")
    return config, weights


def _pickle_message(where, names=None):
    found = f"only PyTorch pickle weights ({', '.join(names)})" if names else f"no {WEIGHTS_NAME}"
    return (
        f"{where} has {found}; keras_vit reads safetensors only (unpickling PyTorch's .bin/.pth files can run "
        f"arbitrary code). Convert the weights to {WEIGHTS_NAME} first, or pick a repository that has one. "
        f"Received: {where}"
    )


def fetch(source, revision=None, token=None, cache_dir=None, local_files_only=False, config_only=False):
    """`(config dict, path of model.safetensors or None, description)` of a
    timm checkpoint: a Hub repository (see `hub_repo`) through
    `huggingface_hub`, or a local directory holding `config.json` and
    `model.safetensors`. With `config_only`, nothing but the config is
    downloaded (so that an unsupported architecture is refused first). The
    weights come from the commit the config came from, and are checked
    against the SHA-256 the Hub names their file by (`fetch_commit`)."""
    return fetch_commit(source, revision, token, cache_dir, local_files_only, config_only)[:3]


def _snapshot_commit(path):
    """The commit of a file in the Hugging Face cache
    (`.../snapshots/<commit>/<file>`), else None."""
    snapshot = os.path.dirname(path)
    return os.path.basename(snapshot) if os.path.basename(os.path.dirname(snapshot)) == "snapshots" else None


def _checked_blob(path):
    """Whether the file `path` links to (a Hub cache blob) has the SHA-256
    it is named by; True where it is named otherwise (a local file, a
    small file the Hub names by its git hash). huggingface_hub does not
    check it: a download damaged in transit loaded as good weights."""
    blob = os.path.realpath(path)
    expected = os.path.basename(blob)
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        return True
    digest = hashlib.sha256()
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest() == expected


def fetch_commit(source, revision=None, token=None, cache_dir=None, local_files_only=False, config_only=False):
    """`fetch`, and the Hub commit the files came from (None for a local
    directory): another call pinned to it (`revision=`) gets the same
    checkpoint even where the repository's branch moves in between."""
    repo = hub_repo(source)
    if repo is not None and "@" in repo:  # timm's `hf-hub:timm/NAME@REVISION`
        repo, named = repo.split("@", 1)
        if revision is not None and revision != named:
            raise ValueError(f"`source` names revision {named!r} and `revision` another: give one. "
                             f"Received: source={source!r}, revision={revision!r}")
        revision = named
    if repo is None:
        directory = os.path.expanduser(os.fspath(source))
        if not os.path.isdir(directory):
            raise ValueError(
                "`source` must be a Hub repository (hf-hub:timm/NAME, timm/NAME or NAME.TAG) or a local "
                f"directory with {CONFIG_NAME} and {WEIGHTS_NAME}. Received: source={source!r}"
            )
        config, weights = _local(directory)
        return _read_config(config), (None if config_only else weights), directory, None
    hub = _require("huggingface_hub")
    errors = _require("huggingface_hub.errors")
    constants = _require("huggingface_hub.constants")
    options = dict(revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only)

    def download(filename, **extra):
        # LocalEntryNotFoundError is an EntryNotFoundError too: it comes first.
        try:
            return hub.hf_hub_download(repo, filename, **{**options, **extra})
        except errors.LocalEntryNotFoundError as error:  # offline (or local_files_only), or the Hub failed
            cached = {name: hub.try_to_load_from_cache(repo, name, cache_dir=cache_dir, revision=options["revision"])
                      for name in (filename, *PICKLE_NAMES)}
            cached_pickles = [name for name in PICKLE_NAMES if isinstance(cached[name], str)]
            if filename == WEIGHTS_NAME and cached_pickles:
                raise ValueError(_pickle_message(f"hf-hub:{repo}", cached_pickles)) from None
            if cached[filename] is not None and not isinstance(cached[filename], str):
                return None  # the cache knows the repository has no such file
            if local_files_only or constants.HF_HUB_OFFLINE:
                why = "offline: HF_HUB_OFFLINE or local_files_only). Connect once to download it"
            else:  # the Hub (or what HF_ENDPOINT names) failed
                why = f"{error.__cause__ or error}; HF_ENDPOINT={constants.ENDPOINT}). Call again when it answers"
            raise ValueError(
                f"hf-hub:{repo}: {filename} is not in the local Hugging Face cache and cannot be downloaded "
                f"now ({why}. Received: source={source!r}"
            ) from error
        except errors.EntryNotFoundError:  # the repository has no such file
            return None
        except errors.GatedRepoError:
            raise ValueError(f"hf-hub:{repo} is gated: accept its terms on the Hub, then pass a token of that "
                             f"account (token= or HF_TOKEN). Received: source={source!r}") from None
        except errors.RepositoryNotFoundError:
            advice = "the token has no access to it" if token or hub.get_token() else "it is private: pass a token"
            raise ValueError(f"hf-hub:{repo} is not a Hub repository (or {advice}). "
                             f"Received: source={source!r}") from None
        except errors.RevisionNotFoundError:
            raise ValueError(f"hf-hub:{repo} has no revision {revision!r}. Received: revision={revision!r}") from None
        except errors.HFValidationError as error:  # not a repository name (nor a directory here)
            raise ValueError(f"`source` is neither a local directory nor a Hub repository name ({error}). "
                             f"Received: source={source!r}") from None
        # The transfer failed (cut short, timed out: httpx's errors, which are
        # no OSError, are `errors.HTTPError`): nothing is cached.
        except (OSError, errors.HTTPError) as error:
            raise OSError(
                f"hf-hub:{repo}: downloading {filename} failed ({type(error).__name__}: {error}); huggingface_hub "
                "keeps no part of it: call again (a slow connection: raise HF_HUB_DOWNLOAD_TIMEOUT, seconds). "
                f"Received: source={source!r}") from error

    config = download(CONFIG_NAME)
    if config is None:
        raise ValueError(f"hf-hub:{repo} has no {CONFIG_NAME}: not a timm model repository. "
                         f"Received: source={source!r}")
    # The weights of the config's commit, even if the branch moves meanwhile.
    options["revision"] = _snapshot_commit(config) or options["revision"]
    config = _read_config(config)
    if config_only:
        return config, None, f"hf-hub:{repo}", options["revision"]
    weights = download(WEIGHTS_NAME)
    if weights is None:
        raise ValueError(_pickle_message(f"hf-hub:{repo}"))
    if not _checked_blob(weights) and not local_files_only and not constants.HF_HUB_OFFLINE:
        weights = download(WEIGHTS_NAME, force_download=True)  # damaged in transit: once more
    if not _checked_blob(weights):
        blob = os.path.realpath(weights)
        raise ValueError(f"hf-hub:{repo}: {blob} (the file {weights} links to) does not have the SHA-256 it is "
                         f"named by: a damaged download. Delete it and load again. Received: source={source!r}")
    return config, weights, f"hf-hub:{repo}", options["revision"]


def load_timm(model, source, interpolation="bicubic_antialias", revision=None, token=None, cache_dir=None,
              local_files_only=False, check_numerics=True, source_grid=None, allow_nonfinite=False):
    """Loads a timm checkpoint (`fetch`'s sources, or a `.safetensors` file)
    into an existing model, all or nothing (the state dict's keys and shapes
    are the check: `keras_vit.weights.timm.load_timm_state`; with
    `check_numerics`, also the GELU, epsilon and heads of the checkpoint's
    config);
    logs and returns the notes on what was adapted. The checkpoint's patch
    grid is `source_grid`, else its config's (`img_size` / `patch_size`),
    else square."""
    from keras_vit.weights import timm as timm_format

    if os.fspath(source).endswith(".safetensors"):  # no config: the keys and shapes are the only check
        weights = where = os.fspath(source)
        config = None
    else:
        config, weights, where = fetch(source, revision, token, cache_dir, local_files_only)
    try:
        recorded_grid = None
        if config is not None:
            args = timm_format.config_args(config)[0]
            if check_numerics:
                _check_numerics(model, timm_format.builder_kwargs(args))
            recorded_grid = _config_grid(args)
        notes = timm_format.load_timm_state(model, read_safetensors(weights), interpolation=interpolation,
                                            source_grid=source_grid, allow_nonfinite=allow_nonfinite,
                                            recorded_grid=recorded_grid)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    for note in notes:
        logger.info("%s: %s", where, note)
    return notes


def _config_grid(args):
    """The patch grid a timm config describes (`img_size` / `patch_size`), or
    None where it does not say."""
    size, patch = args.get("img_size"), args.get("patch_size")
    if size is None or patch is None:
        return None
    size = (size, size) if isinstance(size, int) else tuple(size)
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    return (size[0] // patch[0], size[1] // patch[1])


def _check_numerics(model, expected):
    """The options a state dict's keys and shapes do not show (the GELU, the
    LayerNorm epsilon, the number of heads: timm fuses them in `qkv`; the
    pooling, where the model pools) must be the checkpoint's: loading AugReg 2
    weights into the original architecture (tanh GELU) would run, a little
    off, and a `global_pool="avg"` checkpoint into a class-token model, far
    off."""
    from keras_vit.anatomy import anatomy
    from keras_vit.layers.pooling import pooled_prefix_tokens
    from keras_vit.weights.timm import model_pooling

    parts = anatomy(model)
    block = model.get_layer(parts.block_names[0])
    differences = [f"{name}: the model's {getattr(block, name)!r}, the checkpoint's {expected[name]!r}"
                   for name in ("gelu", "layer_norm_epsilon", "num_heads") if getattr(block, name) != expected[name]]
    method = expected["classifier"] if expected["include_top"] else expected["pooling"]
    pooling = model_pooling(model)
    if method is not None and pooling is not None:  # an unpooled checkpoint or model: the user pools
        left_out = pooled_prefix_tokens(method, expected["pool_include_prefix"], parts.num_prefix_tokens)
        if pooling != (method, left_out):
            differences.append(f"pooling: the model's {pooling[0]!r} leaving out {pooling[1]} prefix token(s), the "
                               f"checkpoint's {method!r} leaving out {left_out} (classifier, pooling, "
                               "pool_include_prefix)")
    if differences:
        raise ValueError(
            f"the model computes otherwise than the checkpoint ({'; '.join(differences)}): build it with "
            "keras_vit.from_timm, or with these keywords. Nothing was loaded."
        )


def export_timm(model, directory, pixel_mean=None, pixel_std=None):
    """Writes `model` as a timm checkpoint: `directory/model.safetensors`
    and `config.json` (timm's Hub format: `architecture`, `model_args`,
    `pretrained_cfg`), which `timm.create_model("local-dir:" + directory,
    pretrained=True)` (or the Hub, once uploaded) loads with keras_vit's
    logits; `keras_vit.from_timm(directory)` reads it back. The original
    architecture exports with timm's tanh GELU (`act_layer="gelu_tanh"`).

    `pixel_mean`, `pixel_std`: the normalisation the model expects, for
    pixels in [0, 1]; default the model's `include_preprocessing` layer's,
    else the original's (0.5, 0.5). Both files are written as `export_npz`
    writes one, and together (`keras_vit.weights.npz.write_files_atomically`):
    a reader never sees half a file, nor one export's file beside another's.
    Returns `directory`.
    """
    from keras_vit.anatomy import anatomy
    from keras_vit.layers.utils import check_float_kernels
    from keras_vit.preprocessing import check_pixel_stats
    from keras_vit.weights import timm as timm_format
    from keras_vit.weights.npz import check_target, write_files_atomically

    anatomy(model)  # names what is not a keras_vit model
    check_float_kernels(model, "export_timm")
    directory = os.path.expanduser(os.fspath(directory))
    if not isinstance(directory, str) or not directory.strip():
        raise ValueError(f"`directory` must be the path of a folder. Received: directory={directory!r}")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"`directory` is a file, not a folder. Received: directory={directory!r}")
    pixel_mean, pixel_std = check_pixel_stats(pixel_mean, pixel_std)
    architecture, args = timm_format.timm_args(model)
    state = timm_format.timm_state(model)
    numpy_io = _require("safetensors.numpy")
    if pixel_mean is None and pixel_std is None:
        layers = {layer.name: layer for layer in model.layers}
        layer = layers.get("preprocess_input")
        pixel_mean, pixel_std = (layer.pixel_mean, layer.pixel_std) if layer is not None else (None, None)
    pixel_mean = list(pixel_mean or (0.5, 0.5, 0.5))
    pixel_std = list(pixel_std or (0.5, 0.5, 0.5))
    config = {
        "architecture": architecture, "num_classes": args["num_classes"], "num_features": args["embed_dim"],
        "global_pool": args["global_pool"], "model_args": {**args, "in_chans": 3},
        "pretrained_cfg": {
            "tag": "keras_vit", "custom_load": False, "input_size": [3, *args["img_size"]],
            "fixed_input_size": True, "interpolation": "bicubic", "crop_pct": 1.0, "crop_mode": "center",
            "mean": pixel_mean, "std": pixel_std, "num_classes": args["num_classes"],
            "first_conv": "patch_embed.proj", "classifier": "head",
        },
    }
    # Both files are checked before either is written, and written together
    # (weights of one export beside the config of another loaded silently).
    targets = [check_target(os.path.join(directory, name), "directory") for name in (WEIGHTS_NAME, CONFIG_NAME)]
    contents = (numpy_io.save(state), (json.dumps(config, indent=2) + "\n").encode("utf-8"))
    write_files_atomically([(path, lambda f, content=content: f.write(content))
                            for (path, _), content in zip(targets, contents)], "directory")
    return directory


