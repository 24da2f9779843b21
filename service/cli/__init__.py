"""The `posenc` console script (`posenc.service.cli.main`) and its subcommands."""
