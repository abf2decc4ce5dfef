"""Backends that run someone else's implementation behind this project's operator signatures.

``backends.upstream``: upstream pypto-lib's own Torch golden functions, loaded from a user's checkout at run time
(``--backend upstream --pypto-lib PATH``). The device binding (``kernels.pypto_backend``) moves here next (issue
#25's one room for backends). A backend here imports contracts' types, never the golden store.
"""
