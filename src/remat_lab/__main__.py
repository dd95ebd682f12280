"""``python -m remat_lab``: the command line (``remat_lab.cli.main``)."""

import sys

from remat_lab.cli import main

sys.exit(main())
