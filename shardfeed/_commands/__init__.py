"""`shardfeed` CLI: the subcommand table (`cli`) and the demo, bench and plan subcommands.

The top layer: may import any other. Subcommand modules are imported lazily so
`shardfeed launch`, `plan` and `split` do not import TensorFlow.
"""
