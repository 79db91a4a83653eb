"""Neutral helpers every layer may use: error text, byte units, ports, the host's
worker count, checked file opens, and the small cross-rank agreements (settings,
a chief's write, a model's variables).

Imports nothing else from shardfeed, and never TensorFlow or a backend.
"""
