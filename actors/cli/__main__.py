"""``python -m actors.cli``: the ``mcplive`` command."""

import sys

from .main import main

sys.exit(main())
