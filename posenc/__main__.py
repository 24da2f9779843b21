"""`python -m posenc`: the `posenc` command (serve, table, check, export, ...)."""

from posenc.service.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
