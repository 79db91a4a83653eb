"""The JAX backend: Keras on JAX over the same resident dataset.

The same layers as the TensorFlow backend, one module per concept (world ->
storage -> dataset -> loop -> Keras surface), sharing the backend-neutral
ones: sources, plan, memory plan, the exchange's arithmetic, the resume state,
callbacks and progress. Nothing here imports TensorFlow.
"""
