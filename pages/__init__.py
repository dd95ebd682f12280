"""The app's pages and their shared code. Importing the package imports the engine, once, in one order.

Every page script's first project import is ``from pages import ...``: the first session to get
here imports the engine modules below while the others wait on this package, so concurrent first
requests cannot interleave their imports (an import-order deadlock between sessions).
"""

import ast as _ast
import gc as _gc
import threading as _threading

# The app's sessions are threads of one process, and CPython 3.11's ast.parse is not safe across
# threads: six deep links at once on a fresh server raised "SystemError: AST constructor recursion
# depth mismatch" (Streamlit's magic and inspect.getsource both parse). One lock for every parse.
if not getattr(_ast.parse, "serialised", False):
    _PARSE_LOCK, _parse = _threading.RLock(), _ast.parse

    def _serialised_parse(*args, **kwargs):
        with _PARSE_LOCK:
            return _parse(*args, **kwargs)

    _serialised_parse.serialised = True
    _ast.parse = _serialised_parse

from pages import _lean_server  # noqa: E402

_lean_server.keep_out()  # before the engine imports JAX: no accelerator plugin in the web server
from remat_lab import config  # noqa: F401, E402
from remat_lab.present import charts, reproduce, tables  # noqa: F401, E402
from remat_lab.serve import safe_text, worker  # noqa: F401, E402
from remat_lab.studies import compare, experiment  # noqa: F401, E402

# Streamlit collects garbage after every script run (``runner.postScriptGC``): a full pass over every
# tracked object, and nearly all of them (about 220,000) are the modules just imported (JAX, Flax,
# Plotly, pandas, Streamlit, the engine), which live as long as the server. Freeze what exists now:
# the collector no longer walks it, so a rerun's pass costs microseconds instead of about 0.15 s of
# CPU on this 2-core machine (tests/test_lean_server.py checks the freeze). What sessions create
# later is collected as before; the objects of the session that ran this import are kept for good.
_gc.freeze()
