"""Neutral helpers every layer may use: error messages, free ports, byte units.

Imports nothing else from shardfeed, and never TensorFlow or Keras.
"""
