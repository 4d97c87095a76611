"""The class of the models keras_vit builds: a functional model whose
weights survive a step that raises."""

import keras


class KeepsWeightsOnError:
    """Mixed into a `keras.Model`: its weights survive a step that raises.

    It changes nothing but on JAX. Keras' JAX trainer takes the values out
    of the model's variables while `fit`, `evaluate` and `predict` run (it
    passes them through the compiled step as state, to hold one copy in
    memory) and puts them back when the loop ends. `fit` does so in a
    `finally`, from its last completed step (none if the first step
    raised); `predict` and `evaluate` do not: after a step that raised (an
    image of a refused size, a bad batch, Ctrl-C) the variables stayed
    empty and the weights were lost, every later call failing with
    `'NoneType' object is not callable`. Here each step (each of an
    execution's `steps_per_execution`) puts the state it was given back
    into the variables before its error propagates, and `predict` and
    `evaluate` put back the last completed step's state after an error
    between executions, as `fit` does. The state's
    layout is the one Keras documents for a JAX `train_step`, `test_step`
    and `predict_step`: trainable, non-trainable, optimizer and metrics
    variables, in that order, as far as the step takes them.
    """

    def predict(self, *args, **kwargs):
        try:
            return super().predict(*args, **kwargs)
        except BaseException:
            _sync_back(self)
            raise

    def evaluate(self, *args, **kwargs):
        try:
            return super().evaluate(*args, **kwargs)
        except BaseException:
            _sync_back(self)
            raise

    def _make_function(self, step_function, *args, **kwargs):
        # Private (pinned by tests/models/test_vit_model.py): JAX's loop of
        # `steps_per_execution` steps lives inside the function this builds
        # from the one-step `step_function`; only there is each step's
        # state at hand. (TensorFlow's trainer has a method of this name
        # too, left as it is.)
        return super()._make_function(_keeping_weights(self, step_function), *args, **kwargs)


@keras.saving.register_keras_serializable(package="keras_vit")
class ViTModel(KeepsWeightsOnError, keras.Model):
    """The functional model every keras_vit builder returns: a `keras.Model`
    built as `ViTModel(inputs, outputs, name=...)`, whose weights survive a
    step that raises (`KeepsWeightsOnError`)."""


def _keeping_weights(model, step):
    """`step(state, data)`, putting `state` back into the model's variables
    if it raises (JAX only; the other backends' steps take no state)."""
    if keras.backend.backend() != "jax":
        return step

    def step_keeping_weights(state, data):
        try:
            return step(state, data)
        except BaseException:
            _put_back(model, state)
            # The trainer keeps the last completed step's state to sync back
            # later (`jax_state_sync`, which a callback's `self.model` calls);
            # after a failed `predict` or `evaluate` that copy stays behind
            # and would write stale weights over any set since. The
            # variables hold the state now: drop the copy (private; pinned
            # by tests/models/test_vit_model.py).
            model._jax_state = None
            raise

    return step_keeping_weights


def _sync_back(model):
    """After an error between executions (in a callback: Ctrl-C while the
    progress bar prints), the last completed step's state is the trainer's to put
    back, as `fit` does in its `finally` (a step that raised has put back
    its own, and left nothing to sync)."""
    if keras.backend.backend() == "jax":
        model.jax_state_sync()


def _put_back(model, state):
    # The state of a train step has 4 lists, of a test step 3 (no optimizer
    # variables), of a predict step 2.
    variable_lists = [model.trainable_variables, model.non_trainable_variables]
    if len(state) == 4:
        variable_lists.append(model.optimizer.variables)
    if len(state) >= 3:
        variable_lists.append(model.metrics_variables)
    pairs = [
        (variable, value)
        for variables, values in zip(variable_lists, state)
        for variable, value in zip(variables, values)
    ]
    # A step that failed after it ran has consumed (donated) the arrays it
    # was given: there is nothing left to put back, and the loop's own
    # restore (fit's) is all there is.
    if any(value.is_deleted() for _, value in pairs if hasattr(value, "is_deleted")):
        return
    for variable, value in pairs:
        variable.assign(value)
