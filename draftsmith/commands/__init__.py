"""The top layer: the `draftsmith` command line, one module per subcommand."""
