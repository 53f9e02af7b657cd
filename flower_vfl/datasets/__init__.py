"""Datasets that are not bundled with scikit-learn (Fashion-MNIST from its Debian package)."""
from flower_vfl.datasets.fashion_mnist import FASHION_MNIST_DIR, load_fashion_mnist
from flower_vfl.datasets.gisette_like import GISETTE_SPLIT, load_gisette_like

__all__ = ["FASHION_MNIST_DIR", "GISETTE_SPLIT", "load_fashion_mnist", "load_gisette_like"]
