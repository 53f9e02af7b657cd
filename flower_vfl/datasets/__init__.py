"""Datasets that are not bundled with scikit-learn (Fashion-MNIST from its Debian package)."""
from .fashion_mnist import FASHION_MNIST_DIR, load_fashion_mnist

__all__ = ["FASHION_MNIST_DIR", "load_fashion_mnist"]
