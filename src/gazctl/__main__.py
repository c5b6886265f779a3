"""``python -m gazctl``: the same as the ``gazctl`` command."""

import sys

from gazctl.main import main

sys.exit(main())
