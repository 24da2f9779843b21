"""`python -m posenc.service.cli`: the `posenc` console script."""

from posenc.service.cli.main import main

raise SystemExit(main())
