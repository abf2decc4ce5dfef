"""TEST DOUBLE of upstream ``golden`` (spec §7.3): TensorSpec, ScalarSpec and run."""
from .runner import RunResult, run
from .spec import ScalarSpec, TensorSpec

TEST_DOUBLE = True
__all__ = ["RunResult", "ScalarSpec", "TensorSpec", "run"]
