"""``python -m mmfeed``: the same as the ``mmfeed`` console script."""

from mmfeed.cli import main

raise SystemExit(main())
