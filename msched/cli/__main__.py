"""``python -m msched.cli``: the ``msched`` command, for an environment without its script."""

from msched.cli import main

raise SystemExit(main())
