"""`shardfeed` CLI: the subcommand table (`cli`), the demo, bench, plan and split subcommands,
and the `NAME=PATH` input specs (`inputs`) of `split` and `plan`.

The top layer: may import any other. Subcommand modules are imported lazily so
`shardfeed launch`, `plan` and `split` do not import TensorFlow.
"""
