"""Device-arithmetic twins of the references: separate implementations that follow the device's tiling and
rounding, judged against the references by the comparators a kernel would face (``--backend emulated``)."""
