"""`python -m service.cli`: the `posenc` console script."""

from service.cli.main import main

raise SystemExit(main())
