"""``python -m ngra ...``: the ``ngra`` command (what ``torchrun -m ngra train ...`` runs)."""

import sys

from ngra.cli import main

sys.exit(main())
