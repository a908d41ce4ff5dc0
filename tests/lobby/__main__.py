"""``python -m tests.lobby [options]``: the test lobby (:mod:`tests.lobby.server`)."""

import sys

from tests.lobby.server import main

sys.exit(main())
