"""``python -m loadkit``: the command line (see ``loadkit.inspection.cli``)."""

from loadkit.inspection.cli import main

raise SystemExit(main())
