"""``python -m loadkit_inspect``: the ``loadkit`` command (see ``loadkit_inspect.cli.main``)."""

from loadkit_inspect.cli.main import main

raise SystemExit(main())
