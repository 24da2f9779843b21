"""The `posenc` console script (`service.cli.main`) and its subcommands."""
