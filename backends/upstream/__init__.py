"""Upstream's own Torch goldens as a backend (``--backend upstream --pypto-lib PATH`` or ``PYPTO_LIB_ROOT``).

Each operator that has an adapter (``backends.upstream.adapters``) lays its arguments out as upstream's golden
function expects them (names, dtypes, padding conventions, the module's geometry), runs that golden function in a
separate worker process (``backends.upstream.worker``) and hands back its outputs in this project's layout. The
worker imports the checkout's model module with the checkout's ``config`` re-targeted at the call's geometry; the
test process never imports upstream code, so upstream's import side effects (``golden`` sets torch's thread count,
model folders go on ``sys.path``) stay in the worker. Nothing of upstream is copied into this project.
"""

from backends.upstream.backend import make_backend

__all__ = ["make_backend"]
