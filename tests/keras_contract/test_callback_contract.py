"""Keras 3.15.1's `keras/src/callbacks/callback_test.py` (tag v3.15.1), on shardfeed.

Adapted: only the data plumbing -- `model.fit(x, y, batch_size=b, ...)` is
`fit(model, x, y, batch_size=b, ...)` (and the same for `evaluate` /
`predict`), which feeds `shardfeed.fit` a `ShardedResidentDataset(x, y,
per_replica_batch_size=b, shuffle=False)` (`_helpers_keras.py`). Every
assertion is Keras'. Expected failures and documented differences are
listed in `conftest.py` (RESULTS.md has the table).
"""

import numpy as np
from _helpers_keras import fit
from keras.src import models, testing
from keras.src.callbacks.callback import Callback


class CallbackTest(testing.TestCase):
    def test_model_state_is_current_on_epoch_end(self):
        test_obj = self

        class TestModel(models.Model):
            def __init__(self):
                super().__init__()
                self.iterations = self.add_variable(
                    shape=(), initializer="zeros", trainable=False
                )

            def call(self, inputs):
                self.iterations.assign(self.iterations + 1)
                return inputs

        class CBK(Callback):
            def on_batch_end(self, batch, logs):
                test_obj.assertEqual(int(self.model.iterations), batch + 1)

        model = TestModel()
        model.compile(optimizer="sgd", loss="mse")
        x = np.random.random((8, 1))
        y = np.random.random((8, 1))
        fit(model, x, y, callbacks=[CBK()], batch_size=2)
