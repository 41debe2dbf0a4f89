"""``python -m attnhal`` — the same as the ``attnhal`` command."""

import sys

from attnhal.cli import main

sys.exit(main())
