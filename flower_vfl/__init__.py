"""flower-vfl: vertical federated learning (ADMM sharing) with differential privacy for Flower."""
from .core.engine import VerticalADMM

__version__ = "0.1.0"
__all__ = ["VerticalADMM", "__version__"]
