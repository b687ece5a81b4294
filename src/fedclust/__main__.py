"""``python -m fedclust``: the ``fedclust`` command."""

import sys

from .cli import main

sys.exit(main())
