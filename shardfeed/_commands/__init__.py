"""The `shardfeed` command line: the subcommand table (`cli`) and one module per subcommand.

The top layer: it may import any other. Subcommands are imported when they
run, so `launch`, `plan` and `split` start without TensorFlow.
"""
