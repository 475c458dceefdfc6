"""``python -m loadkit``: the command line (see ``loadkit.cli``)."""

from loadkit.cli import main

raise SystemExit(main())
