"""Run the same `fit` script on one device, a TPU, several GPUs or hosts.

`get_distribution(mode)` returns a `DistributionSetup` whose `scope()` is
entered to build, compile and fit the model:

```python
setup = keras_vit.distribute.get_distribution("auto")
with setup.scope():
    model = keras_vit.ViTB16(num_classes=10, weights="imagenet21k")
    model.compile(optimizer=..., loss=...)
    model.fit(train_ds, ...)  # batches of the *global* batch size
```

What each mode means per backend:

| mode | TensorFlow | JAX | PyTorch |
|---|---|---|---|
| `"none"` | default strategy | no distribution | single device |
| `"tpu"` | `TPUStrategy` | `DataParallel` over TPU cores | error |
| `"mirrored"` | `MirroredStrategy` (GPUs, else logical CPUs) | error | error |
| `"data_parallel"` | error | `DataParallel` | error |
| `"model_parallel"` | error | `ModelParallel` + ViT layout map | error |
| `"auto"` | TPU, else >1 GPU, else none | >1 device: data parallel | none |

Several hosts: JAX (`multi_host=True`) or a TPU pod. TensorFlow's
`MultiWorkerMirroredStrategy` is not offered: Keras' `fit` fails under it
(keras-team/keras#20585, `strategy.reduce` of the first batch), and a
`TF_CONFIG` listing several workers is refused with that advice.

Backend modules (`tensorflow`, `jax`) are imported inside functions, only
under the matching Keras backend.
"""

import contextlib
import importlib.util
import json
import os
import sys
import warnings

import keras
import numpy as np

from keras_vit.layers.utils import is_int

MODES = (
    "auto",
    "none",
    "tpu",
    "mirrored",
    "data_parallel",
    "model_parallel",
)
_BACKEND_MODES = {
    "tensorflow": ("none", "tpu", "mirrored"),
    "jax": ("none", "tpu", "data_parallel", "model_parallel"),
    "torch": ("none",),
}
_SUGGESTION = {
    "tensorflow": "With the TensorFlow backend use 'tpu' or 'mirrored'.",
    "jax": "With the JAX backend use 'tpu', 'data_parallel' or 'model_parallel'.",
    "torch": (
        "keras_vit trains on a single device with the PyTorch backend; switch "
        "to KERAS_BACKEND=jax or tensorflow for several devices (see "
        "docs/training.md)."
    ),
}


class DistributionSetup:
    """What `fit` needs to run under a distribution mode.

    Returned by `get_distribution`; not meant to be built directly.

    Attributes:
        mode: the resolved mode (`"auto"` is replaced by the chosen one).
        backend: the Keras backend.
        strategy: the `tf.distribute.Strategy` (TensorFlow), else None.
        distribution: the `keras.distribution.Distribution` (JAX), else None.
        num_replicas: how many ways each global batch is split.
        model_parallel_size: size of the `model` mesh axis (1 unless
            `"model_parallel"`).
    """

    def __init__(
        self,
        mode,
        backend,
        strategy=None,
        distribution=None,
        num_replicas=1,
        model_parallel_size=1,
    ):
        self.mode = mode
        self.backend = backend
        self.strategy = strategy
        self.distribution = distribution
        self.num_replicas = int(num_replicas)
        self.model_parallel_size = int(model_parallel_size)

    def scope(self):
        """Context in which to create, compile and fit the model.

        TensorFlow: `strategy.scope()`. JAX: the distribution's scope (it
        must also cover `fit`/`predict`, which read it to shard the data).
        Otherwise a no-op.
        """
        if self.strategy is not None:
            return self.strategy.scope()
        if self.distribution is not None:
            return self.distribution.scope()
        return contextlib.nullcontext()

    def per_replica_batch_size(self, global_batch_size):
        """The share of each replica; the global batch must divide evenly.

        Datasets are batched with the *global* batch size (e.g. the paper's
        512); each step splits it over `num_replicas`.
        """
        if (
            not is_int(global_batch_size)
            or global_batch_size <= 0
            or global_batch_size % self.num_replicas
        ):
            raise ValueError(
                f"The global batch size must be a positive multiple of the "
                f"number of replicas ({self.num_replicas}, mode={self.mode!r}). "
                f"Received: global_batch_size={global_batch_size!r}"
            )
        return int(global_batch_size) // self.num_replicas

    def predict(self, model, x, batch_size=32, **kwargs):
        """`model.predict` on arrays of any length.

        JAX shards every batch over the devices and fails on a batch that
        does not divide (the last one of 100 rows over 8 devices). Here the
        batch size is rounded up to a multiple of the replicas and the rows
        are padded (by repeating the last row) to a whole number of batches;
        the padded outputs are dropped. Call it inside `scope()`.

        Args:
            model: a Keras model.
            x: a numpy array, or a list/dict of arrays with the same rows.
            batch_size: int. Rounded up to a multiple of `num_replicas`.
            **kwargs: passed to `model.predict`.

        Returns:
            The predictions for exactly the rows of `x`.

        Raises:
            NotImplementedError: in a multi-process (multi-host) run, where
                Keras takes no numpy input and the outputs span every host's
                devices: evaluate there, on a pipeline with
                `pad_to_batch=True` (docs/training.md).
        """
        if process_count() > 1:
            raise NotImplementedError(
                "DistributionSetup.predict runs in one process: in a multi-host run Keras takes no numpy input "
                "and the outputs span the devices of every host. Evaluate on a pipeline with pad_to_batch=True "
                "(and padded_batch_metrics), or predict in a single-host process. "
                f"Received: {process_count()} processes"
            )
        if not is_int(batch_size) or batch_size <= 0:
            raise ValueError(
                f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}"
            )
        replicas = self.num_replicas
        batch_size = -(-int(batch_size) // replicas) * replicas
        leaves = keras.tree.flatten(x)
        rows = {int(np.shape(leaf)[0]) for leaf in leaves}
        if len(rows) != 1:
            raise ValueError(
                "All inputs must have the same number of rows. "
                f"Received inputs with rows {sorted(rows)}"
            )
        num_rows = rows.pop()
        padded_rows = max(-(-num_rows // batch_size) * batch_size, batch_size)
        if replicas > 1 and padded_rows != num_rows:

            def pad(leaf):
                leaf = np.asarray(leaf)
                filler = np.repeat(leaf[-1:], padded_rows - num_rows, axis=0)
                return np.concatenate([leaf, filler], axis=0)

            x = keras.tree.map_structure(pad, x)
        outputs = model.predict(x, batch_size=batch_size, **kwargs)
        return keras.tree.map_structure(lambda out: out[:num_rows], outputs)

    def __repr__(self):
        return (
            f"DistributionSetup(mode={self.mode!r}, backend={self.backend!r}, "
            f"num_replicas={self.num_replicas}, "
            f"model_parallel_size={self.model_parallel_size})"
        )


def get_distribution(
    mode="auto",
    *,
    tpu=None,
    devices=None,
    model_parallel_size=None,
    multi_host=False,
):
    """Sets up multi-device training for the active Keras backend.

    Args:
        mode: one of `"auto"`, `"none"`, `"tpu"`, `"mirrored"`,
            `"data_parallel"`, `"model_parallel"` (see the table in this
            module's docstring).
        tpu: TensorFlow `"tpu"` mode only: the TPU name or address for
            `TPUClusterResolver` (`"local"` on a TPU VM). Defaults to
            `$TPU_NAME`, else `"local"` on a TPU VM, else the resolver's own
            lookup (legacy Colab).
        devices: optional list of devices: TensorFlow device strings for
            `"mirrored"` (e.g. `["/gpu:0", "/gpu:1"]`), Keras device strings
            for the JAX modes (e.g. `["cpu:0", ...]`). Defaults to all.
        model_parallel_size: `"model_parallel"` only: size of the `model`
            mesh axis; the device count must be a multiple of it. Defaults to
            the largest of 8, 4, 2, 1 that divides the device count.
        multi_host: JAX only: call `keras.distribution.initialize()` first
            (TPU pods, multi-host GPU clusters; addresses come from the TPU
            environment or `KERAS_DISTRIBUTION_*` variables), or, after the
            user's own `jax.distributed.initialize()`, give every process
            one random seed. Data parallel only. Build the training
            pipelines after this call (or seed them). A process of a
            multi-process run is refused without it.

    Returns:
        A `DistributionSetup`.
    """
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
    backend = keras.backend.backend()
    if backend not in _BACKEND_MODES:
        raise ValueError(f"Unsupported Keras backend {backend!r}. Received: mode={mode!r}")
    if multi_host and backend != "jax":
        raise ValueError(
            "`multi_host=True` is for the JAX backend; with TensorFlow use "
            "mode='tpu' on a TPU pod, or switch to KERAS_BACKEND=jax for "
            "several GPU hosts. "
            f"Received: multi_host={multi_host!r} with backend {backend!r}"
        )
    if mode != "auto" and mode not in _BACKEND_MODES[backend]:
        raise ValueError(
            f"mode={mode!r} is not available with the {backend} backend. "
            f"{_SUGGESTION[backend]} Received: mode={mode!r}"
        )
    if devices is not None and (isinstance(devices, str) or not isinstance(devices, (list, tuple))
                                or not devices):
        # A string was read as one device per character, an empty list as no replicas.
        raise ValueError(f"`devices` must be None (all) or a non-empty list of devices. Received: devices={devices!r}")
    if devices is not None and len({str(device).lower() for device in devices}) < len(devices):
        # Counted twice as replicas: JAX then failed building the model with a bare AssertionError.
        raise ValueError(f"`devices` names a device twice. Received: devices={devices!r}")
    if tpu is not None and (backend != "tensorflow" or mode not in ("tpu", "auto")):
        raise ValueError(f"`tpu` is for TensorFlow's mode='tpu' (or 'auto'); it is not used with mode={mode!r} on "
                         f"the {backend} backend. Received: tpu={tpu!r}")
    if model_parallel_size is not None and mode != "model_parallel":
        raise ValueError(
            "`model_parallel_size` only applies to mode='model_parallel'. "
            f"Received: model_parallel_size={model_parallel_size!r}, mode={mode!r}"
        )
    if backend == "tensorflow":
        return _tensorflow_setup(mode, tpu=tpu, devices=devices)
    if backend == "jax":
        return _jax_setup(
            mode,
            devices=devices,
            model_parallel_size=model_parallel_size,
            multi_host=multi_host,
        )
    if devices is not None:
        raise ValueError(
            "`devices` is not used with the torch backend (single device). "
            f"Received: devices={devices!r}"
        )
    return DistributionSetup("none", backend)


# --------------------------------------------------------------------------
# TensorFlow
# --------------------------------------------------------------------------


def _tpu_vm():
    """Whether this machine looks like a Cloud TPU VM (Colab/Kaggle TPUs)."""
    if os.environ.get("TPU_ACCELERATOR_TYPE") or os.environ.get("TPU_WORKER_ID"):
        return True
    return os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0")


def _tpu_hint():
    return bool(
        os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR") or _tpu_vm()
    )


def _tf_tpu_strategy(tpu):
    import tensorflow as tf

    if tpu is None:
        tpu = os.environ.get("TPU_NAME") or ("local" if _tpu_vm() else None)
    try:
        # Resolve, connect and initialise the TPU system in one call.
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver.connect(tpu=tpu)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise RuntimeError(
            "No TPU could be initialised for mode='tpu'. On Colab/Kaggle, "
            "select a TPU runtime/accelerator; on a TPU VM pass tpu='local'; "
            "elsewhere pass the TPU name or grpc:// address, or use "
            f"mode='auto'. Received: mode='tpu', tpu={tpu!r}. "
            f"TensorFlow said: {type(error).__name__}: {str(error).splitlines()[0]}"
        ) from None
    return strategy


def _tf_config_workers():
    text = os.environ.get("TF_CONFIG", "{}") or "{}"
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        # TensorFlow's cluster resolvers would fail on it later, with
        # json's bare message.
        raise ValueError(f"$TF_CONFIG is not JSON ({error}). Received: TF_CONFIG={text!r}") from None
    if not isinstance(config, dict):
        raise ValueError(f"$TF_CONFIG must be a JSON object. Received: TF_CONFIG={text!r}")
    cluster = config.get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _tensorflow_setup(mode, tpu, devices):
    import tensorflow as tf

    workers = _tf_config_workers()
    if workers > 1 and mode != "tpu":
        raise RuntimeError(
            f"TF_CONFIG lists {workers} workers, but keras_vit cannot train "
            "on several TensorFlow workers: Keras' fit fails under "
            "MultiWorkerMirroredStrategy (keras-team/keras#20585). Use "
            "KERAS_BACKEND=jax with get_distribution('data_parallel', "
            "multi_host=True), or mode='tpu' on a TPU pod, or unset TF_CONFIG to "
            f"train on this host only. Received: mode={mode!r}"
        )
    if mode == "auto":
        if _tpu_hint() or tpu is not None:
            mode = "tpu"
        elif devices is not None or len(tf.config.list_logical_devices("GPU")) > 1:
            mode = "mirrored"
        else:
            mode = "none"
    if mode == "tpu":
        strategy = _tf_tpu_strategy(tpu)
    elif mode == "mirrored":
        if devices is None and not tf.config.list_logical_devices("GPU"):
            # No GPU: the logical CPUs, when the CPU was split into several
            # (TensorFlow itself would mirror over CPU:0 alone).
            cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
            devices = cpus if len(cpus) > 1 else None
        strategy = tf.distribute.MirroredStrategy(devices=devices)
    else:
        strategy = tf.distribute.get_strategy()
    return DistributionSetup(
        mode, "tensorflow", strategy=strategy, num_replicas=strategy.num_replicas_in_sync
    )


def _jax_devices_holding(variable):
    """How many devices a JAX variable's value lives on."""
    sharding = getattr(variable.value, "sharding", None)
    return len(sharding.device_set) if sharding is not None else 1


def check_built_in_scope(model, function):
    """Raises ValueError when a JAX distribution over several devices is
    active and `model`'s variables live on one device: the model was built
    before the distribution was set, and JAX's trainer failed with
    "Received incompatible devices for jitted computation", naming neither
    the model nor the fix."""
    distribution = keras.distribution.distribution() if keras.backend.backend() == "jax" else None
    variable = next(iter(model.weights), None)
    if distribution is None or variable is None:
        return
    wanted = distribution.device_mesh.devices.size
    if wanted > 1 and _jax_devices_holding(variable) == 1:
        raise ValueError(
            f"Model {model.name!r} was built outside the distribution now active ({wanted} devices): its variables "
            f"live on one device, which `{function}` cannot mix with the distributed batches. Build the model "
            f"inside `setup.scope()` (or load it there). Received: model={model.name!r}")


def check_scope(model, function):
    """Raises ValueError when `model`'s variables are distributed (created
    in a `DistributionSetup.scope()`) and no distribution is active: the
    variables `function` adds would live on one device, and `fit` would
    fail with the backend's message (JAX: incompatible devices; TensorFlow:
    a bare assertion)."""
    backend = keras.backend.backend()
    variable = next(iter(model.weights), None)
    if variable is None or backend not in ("tensorflow", "jax"):
        return
    if backend == "tensorflow":
        import tensorflow as tf

        value = variable.value
        devices = (value.distribute_strategy.num_replicas_in_sync
                   if isinstance(value, tf.distribute.DistributedValues) else 1)
        active = tf.distribute.has_strategy()
    else:
        devices = _jax_devices_holding(variable)
        active = keras.distribution.distribution() is not None
    if devices > 1 and not active:
        raise ValueError(
            f"`{function}` adds variables to model {model.name!r}, whose variables are distributed over "
            f"{devices} devices: call it inside the `setup.scope()` the model was created in (outside, the "
            f"new variables would live on one device). Received: model={model.name!r}")


def tf_replica_context():
    """The TF replica context when gradients are split over >1 replicas.

    Used by `keras_vit.training` optimizers to clip the global norm of the
    summed gradient. None on other backends or with a single replica.
    """
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    return context


def draw_for_global_batch(sample, shape, *args, **kwargs):
    """`sample(shape, *args, **kwargs)` (a `keras.random` function drawing
    one row per example along axis 0) as this replica's rows of one draw
    for the global batch.

    Under `tf.distribute` a `keras.random.SeedGenerator`'s state is
    mirrored, so every replica would draw the same numbers: the same
    drop-path and corruption pattern, repeated once per replica. Each
    replica draws for all of them and keeps its own rows, which is what
    one device draws for the whole batch (JAX's data parallelism draws
    globally already). The draws are per example, so the extra numbers
    are few.
    """
    context = tf_replica_context()
    if context is None:
        return sample(shape, *args, **kwargs)
    batch, rest = shape[0], tuple(shape[1:])
    values = sample((context.num_replicas_in_sync * batch, *rest), *args, **kwargs)
    return keras.ops.slice(values, (context.replica_id_in_sync_group * batch,) + (0,) * len(rest), (batch, *rest))


# --------------------------------------------------------------------------
# JAX
# --------------------------------------------------------------------------


def vit_layout_map(device_mesh, model_axis="model"):
    """A `keras.distribution.LayoutMap` sharding a ViT over `model_axis`.

    Megatron-style tensor parallelism: the query/key/value kernels
    `(D, heads, head_dim)` and the first MLP kernel `(D, mlp_dim)` are split
    along heads / hidden units, the attention output kernel
    `(heads, head_dim, D)` and the second MLP kernel `(mlp_dim, D)` along
    their input; everything else (embeddings, norms, biases, head) is
    replicated. Optimizer slots follow their variable's layout.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` with an axis named
            `model_axis`.
        model_axis: name of the tensor-parallel mesh axis.

    Returns:
        A `keras.distribution.LayoutMap`.
    """
    if model_axis not in device_mesh.axis_names:
        raise ValueError(
            f"The device mesh has no axis {model_axis!r} (axes: "
            f"{list(device_mesh.axis_names)}). Received: model_axis={model_axis!r}"
        )
    layout_map = keras.distribution.LayoutMap(device_mesh)
    attention = ".*MultiHeadDotProductAttention_1/"
    layout_map[attention + "(query|key|value)/kernel"] = (None, model_axis, None)
    layout_map[attention + "attention_output/kernel"] = (model_axis, None, None)
    layout_map[".*MlpBlock_3/Dense_0/kernel"] = (None, model_axis)
    layout_map[".*MlpBlock_3/Dense_1/kernel"] = (model_axis, None)
    return layout_map


class _ViTModelParallel(keras.distribution.ModelParallel):
    """`ModelParallel` that replicates a weight whose sharded dimension does
    not divide over the mesh axis (e.g. 3 heads on a model axis of 4), with a
    warning, instead of failing inside JAX."""

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        if not isinstance(layout, keras.distribution.TensorLayout):
            # An existing variable's own, already resolved layout (Keras
            # 3.10 returns it; optimizer slots ask with their variable).
            return layout
        axes = tuple(layout.axes)
        mesh = dict(zip(self.device_mesh.axis_names, self.device_mesh.shape))
        for size, axis in zip(variable.shape, axes):
            if axis is not None and size % mesh[axis]:
                warnings.warn(
                    f"Replicating {variable.path} {tuple(variable.shape)}: its "
                    f"dimension of {size} does not divide over the {mesh[axis]} "
                    f"devices of mesh axis {axis!r}.",
                    stacklevel=2,
                )
                return keras.distribution.TensorLayout(
                    [None] * len(variable.shape), self.device_mesh
                )
        return layout


def _jax_setup(mode, devices, model_parallel_size, multi_host):
    if multi_host:
        _start_multi_host(mode)
    elif _int_env("KERAS_DISTRIBUTION_NUM_PROCESSES") > 1 or process_count() > 1:
        raise RuntimeError(
            "This process is one of several (jax.distributed or KERAS_DISTRIBUTION_NUM_PROCESSES), but "
            "multi_host=False would train each process on its own devices, a run of its own. Pass "
            "multi_host=True (the recipes run on one host). Received: multi_host=False"
        )
    if mode == "tpu":
        try:
            tpu_devices = keras.distribution.list_devices("tpu")
        except RuntimeError:
            tpu_devices = []
        if not tpu_devices:
            raise RuntimeError(
                "No TPU found by JAX for mode='tpu' (install `jax[tpu]` on a "
                "TPU VM, or use mode='auto'). "
                f"Received: mode='tpu', devices={keras.distribution.list_devices()}"
            )
        devices = devices or tpu_devices
        mode = "data_parallel"
    devices = list(devices) if devices is not None else keras.distribution.list_devices()
    if mode == "auto":
        mode = "data_parallel" if len(devices) > 1 else "none"
    if mode == "none":
        return DistributionSetup("none", "jax")
    if mode == "data_parallel":
        distribution = keras.distribution.DataParallel(devices=devices)
        return DistributionSetup(
            mode, "jax", distribution=distribution, num_replicas=len(devices)
        )
    # model_parallel
    count = len(devices)
    if model_parallel_size is None:
        model_parallel_size = next(m for m in (8, 4, 2, 1) if count % m == 0)
    if (
        not is_int(model_parallel_size)
        or model_parallel_size <= 0
        or count % model_parallel_size
    ):
        raise ValueError(
            f"`model_parallel_size` must be a positive divisor of the device "
            f"count ({count}). Received: model_parallel_size={model_parallel_size!r}"
        )
    mesh = keras.distribution.DeviceMesh(
        shape=(count // model_parallel_size, model_parallel_size),
        axis_names=("batch", "model"),
        devices=devices,
    )
    distribution = _ViTModelParallel(
        layout_map=vit_layout_map(mesh), batch_dim_name="batch"
    )
    return DistributionSetup(
        mode,
        "jax",
        distribution=distribution,
        num_replicas=count // model_parallel_size,
        model_parallel_size=model_parallel_size,
    )


def _int_env(name):
    try:
        return int(os.environ.get(name) or 0)
    except ValueError:
        raise ValueError(f"${name} must be an int. Received: {name}={os.environ[name]!r}") from None


def _start_multi_host(mode):
    """`keras.distribution.initialize()` (jax.distributed), unless JAX's
    distributed system is already up, then one random state for every
    process."""
    import jax

    if mode == "model_parallel":
        # Keras reads a weight by fetching every shard to one process
        # (`get_weights`, `save`): weights sharded over several hosts could
        # train but never be saved.
        raise ValueError(
            "mode='model_parallel' shards weights over the devices of several processes, which Keras "
            "cannot save (it fetches a weight whole to one process); use mode='data_parallel' across "
            "hosts. Received: mode='model_parallel', multi_host=True"
        )
    pipelines = sys.modules.get("keras_vit.data.pipelines")
    if pipelines is not None and pipelines.unseeded_training_pipelines:
        raise RuntimeError(
            f"{pipelines.unseeded_training_pipelines} keras_vit training pipeline(s) were built with seed=None "
            "before the multi-host start: their order and augmentation come from TensorFlow's global seed, "
            "which differs between processes until this call, so each host would feed its part of every "
            "batch from another order (examples seen twice or never). Build the pipelines after "
            "get_distribution(multi_host=True), or pass them the same seed= on every host."
        )
    if not jax.distributed.is_initialized():  # else started by the user (`jax.distributed.initialize`)
        # CPU hosts need a cross-process collective implementation; older
        # JAX releases set none by default ("Multiprocess computations aren't
        # implemented on the CPU backend"). Accelerators are not affected.
        if jax.config.values.get("jax_cpu_collectives_implementation") in (None, "none"):
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        try:
            keras.distribution.initialize()
        except ValueError as error:
            if "coordinator_address" not in str(error):
                raise
            raise ValueError(
                "multi_host=True found no cluster: set KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator's "
                "host:port), KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID on every process "
                f"(a TPU pod sets its own). JAX said: {error}"
            ) from None
    _agree_on_random_state()


def _agree_on_random_state():
    """One random state for every process. Keras draws unseeded initial
    weights from Python's generator, and `seed=None` pipelines draw from
    TensorFlow's; Keras' start seeds only processes with no seed set, so
    hosts seeded apart (`set_random_seed(seed + process_index)`) drew
    weights apart (refused in `device_put`, naming no seed), and hosts that
    seeded Python's generator alone read their pipelines in orders apart."""
    import random

    # One draw per process; their sum seeds them all alike (Python, NumPy,
    # TensorFlow, Keras), repeatably where the processes were seeded.
    keras.utils.set_random_seed(sum(all_processes(random.randint(0, 2**31 - 1))) % 2**31)


# --------------------------------------------------------------------------
# Process and random state, for resumable runs (training.BackupAndResume).
# The backend modules are imported here, lazily, as for the strategies.
# --------------------------------------------------------------------------


def process_index():
    """This process's index in a multi-process JAX run (0 otherwise)."""
    if keras.backend.backend() != "jax":
        return 0
    import jax

    return jax.process_index()


def process_count():
    """The processes of a multi-process JAX run (1 otherwise)."""
    if keras.backend.backend() != "jax":
        return 1
    import jax

    return jax.process_count()


def all_processes(value):
    """`value` (an int) from every process of a multi-process JAX run, in
    process order (`[value]` otherwise): a failure on one process reaches the
    others, which would otherwise wait in JAX's collectives until it times out."""
    if process_count() == 1:
        return [int(value)]
    from jax.experimental import multihost_utils

    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.int64(value))).ravel()]


def backend_rng_state():
    """PyTorch's own generators (CPU, then each GPU) as lists, or None on
    other backends: Keras' unseeded `Dropout` draws its mask from them on
    PyTorch (`torch.nn.functional.dropout`), not from a SeedGenerator."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return [state.tolist() for state in states]


def set_backend_rng_state(states):
    """Restores what `backend_rng_state` returned."""
    if keras.backend.backend() != "torch":
        raise ValueError(
            "The checkpoint holds PyTorch random state but the backend is "
            f"{keras.backend.backend()!r}: resume with KERAS_BACKEND=torch."
        )
    import torch

    cpu, *gpus = [torch.tensor(state, dtype=torch.uint8) for state in states]
    torch.set_rng_state(cpu)
    if gpus:
        torch.cuda.set_rng_state_all(gpus)


def enable_determinism():
    """Makes reruns give the same weights bit for bit, also where the
    defaults do not: input pipelines with stateful random layers (Keras'
    preprocessing layers in tf.data: TensorFlow's op determinism makes
    tf.data call them one batch at a time, in order), and GPU kernels
    (TensorFlow's ops pick deterministic kernels; on PyTorch,
    `torch.use_deterministic_algorithms(True)` with the fixed cuBLAS
    workspace it needs). XLA on CPUs and TPUs is deterministic as it is;
    for JAX on GPUs set XLA's own flag in `XLA_FLAGS` before starting
    (docs/recipes.md). A process-wide switch: it stays on. Without
    TensorFlow installed (no tf.data pipelines) only the backend's part."""
    if importlib.util.find_spec("tensorflow") is not None:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    if keras.backend.backend() == "torch":
        import torch

        # cuBLAS is deterministic only with a fixed workspace (PyTorch's
        # "Reproducibility" notes); read when the first CUDA matmul runs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
