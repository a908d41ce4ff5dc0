"""``python -m actors.cli``: the ``mcplive`` command."""

import sys

from . import main

sys.exit(main())
