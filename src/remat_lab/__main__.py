import sys

from remat_lab.cli import main

sys.exit(main())
