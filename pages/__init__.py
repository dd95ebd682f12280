"""The app's pages and their shared code. Importing the package imports the engine, once, in one order.

Every page script's first project import is ``from pages import ...``: the first session to get
here imports the engine modules below while the others wait on this package, so concurrent first
requests cannot interleave their imports (an import-order deadlock between sessions).
"""

from remat_lab import config  # noqa: F401
from remat_lab.present import charts, reproduce, tables  # noqa: F401
from remat_lab.serve import safe_text, worker  # noqa: F401
from remat_lab.studies import compare, experiment  # noqa: F401
