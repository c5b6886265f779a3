"""``python -m gazette.gazctl``: the same as the ``gazctl`` command."""

import sys

from gazette.gazctl.main import main

sys.exit(main())
