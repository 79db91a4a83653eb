"""The engines under TensorFlow's backend: how replicas run and what crosses
between them (tf.distribute strategies, Horovod), and what only they use
(the all-to-all, the gradients' collectives, SLURM's TF_CONFIG, the peer named
in a collective failure, the engines' metric reductions)."""
