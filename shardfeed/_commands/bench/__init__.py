"""`shardfeed bench`: where an epoch's time goes -- `model.fit`, `shardfeed.fit`, the floor.

Separation of concerns: this package owns the benchmark only, one concept per
module -- `cli` (flags and the run), `machine` (what the numbers were measured
on), `workloads` (the W1-W6 data and models, shared with `shardfeed demo`),
`variants` (what is timed), `backend_worker` (the process a variant on
another Keras backend runs in), `timing` (the epoch timer), `tuning` (the
`model.fit` settings probe), `schedule` (warm-up, then interleaved timed
rounds), `report` (JSON, Markdown, chart), `engines` (`--engines`) and
`capacity` (`--capacity`, on JAX). It
trains through the public `shardfeed.fit`; for the floor it reuses the
compiled train step of the `Loop` that `fit` builds, so the floor moves
whenever the step does. It is a benchmark, not a test: `tests/test_bench.py`
only checks that it runs.

Conditions travel with the numbers (airbench style): every report records the
CPU, cores, RAM, OS, library versions, the date, the rows scale and how many
timed epochs each median is taken over. Numbers from a shared or loaded
machine, from `--rows-scale` below 1 or from fewer than 3 timed epochs are
smoke checks, not results.

Variants, all at the workload's batch (256; W5 64, W6 128), Adam(1e-3), same initial
weights (copied from one reference model), each with its own model instance:
    numpy      `model.fit(x, y, batch_size=batch, shuffle=True)`, Keras defaults.
    tfdata     `model.fit` on `from_tensor_slices.cache.shuffle.batch.prefetch`.
    tuned      `tfdata` with the fastest `steps_per_execution` x `jit_compile`
               found by a short probe in the same process.
    jax        `numpy` on Keras' JAX backend, in a worker process of its own
               (`KERAS_BACKEND=jax`; skipped, saying why, without JAX).
    jax-tuned  `jax` with the probe's fastest settings, probed in that process.
    shardfeed  `shardfeed.fit` with default `FitOptions()`.
    floor      `Loop.train_step` on one fixed device batch inside the same
               compiled loop shape: the compute floor, no input work at all.
    streaming  `shardfeed.fit` streaming its rows through the two-slot ring.
    floor-opaque  `floor` with the batch made to depend on the step, so XLA
               cannot hoist work on it out of the loop (no real input can be
               hoisted): the floor a free input path would reach.
    shardfeed-jax, floor-jax  `shardfeed` and the floor on Keras' JAX backend,
               each in a worker process of its own, like `jax`.
    jax-nightly-tuned  `jax-tuned` on keras-nightly (3.16.0.dev, on-device
               `lax.scan` for steps_per_execution), in a worker process whose
               path starts with $SHARDFEED_KERAS_NIGHTLY_PATH; run only when
               named, skipped saying why without it.
Timing: each timed epoch is measured from `on_epoch_begin` to `on_epoch_end`
(the loss is read back first, so the work is done), so per-`fit`-call set-up is
excluded; the warm-up column is the whole first `fit` call, compilation
included. Variants run round-robin one epoch each, in a rotated order each
round, so drift in machine load spreads over all of them.

With `KERAS_BACKEND=jax` the whole bench runs on Keras' JAX backend, no
TensorFlow imported: `jax_variants` (jax, jax-tuned, shardfeed, floor; and
jax-nightly-tuned when named).

This `__init__` imports nothing: `shardfeed demo` imports `workloads` alone,
and `shardfeed launch` (which builds the whole CLI parser) never pays for
TensorFlow.
"""
