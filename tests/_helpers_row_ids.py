"""The row-id model of the TensorFlow resume tests (`tests/_training/test_resume.py`
in process, `tests/_launch/test_resume_launch.py` in its workers, which put tests/
on `sys.path`): the logged row-id hash of an epoch proves every row was used
exactly once across a preemption. TensorFlow only."""

from __future__ import annotations

import keras
import tensorflow as tf


class RowHash(keras.metrics.Metric):
    """Count, sum and sum of squares of the row ids a model trained on."""

    def __init__(self, name="rows", **kwargs):
        super().__init__(name=name, dtype="float64", **kwargs)
        self.stats = self.add_variable(
            shape=(3,), initializer="zeros", dtype="float64", aggregation="sum", name="stats"
        )

    def update_state(self, ids):
        ids = tf.cast(ids, "float64")
        self.stats.assign_add(
            tf.stack([tf.cast(tf.size(ids), "float64"), tf.reduce_sum(ids), tf.reduce_sum(ids**2)])
        )

    def result(self):
        return {"row_count": self.stats[0], "row_sum": self.stats[1], "row_sumsq": self.stats[2]}


class IdModel(keras.Model):
    """A small MLP on all but the last input column (the row id)."""

    def __init__(self):
        super().__init__(name="ids")
        self.hidden = keras.layers.Dense(8, activation="relu", name="hidden")
        self.out = keras.layers.Dense(1, name="out")
        self.row_hash = RowHash()

    def call(self, x):
        return self.out(self.hidden(x[:, :-1]))

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        self.row_hash.update_state(x[:, -1])
        return super().compute_metrics(x, y, y_pred, sample_weight)
