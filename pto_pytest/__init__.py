"""The top floor: the pytest plugin (``pto_pytest.plugin``: backend selection, hypothesis profiles, the per-operator
summary, the golden-tree tests' store) and the seeded-defect helper (``pto_pytest.defect``). Nothing below imports
this package: the references (``kernels``), the judges (``contracts``), the backends and the store tool (``goldens``)
stand without it.
"""
