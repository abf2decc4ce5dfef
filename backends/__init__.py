"""Backends that run someone else's implementation behind this project's operator signatures.

``backends.upstream``: upstream pypto-lib's own Torch golden functions, loaded from a user's checkout at run time
(``--backend upstream --pypto-lib PATH``); ``backends.pypto``: upstream's A5 kernels on a5sim / a5 through
upstream's own runner (``--backend pypto``). Both run upstream code only in the worker process of
``backends.upstream``. A backend here imports contracts' types, never the golden store.
"""
