"""Party data sources (no Flower imports): a party's own export with an ID column.

``flower_vfl.io.sources`` reads CSV, Parquet and LIBSVM/svmlight files into
``(ids, X, columns, y)``; ``flower_vfl.io.preprocess`` fits the party-side preprocessing on
the party's own training rows and keeps it; ``flower_vfl.io.bundled`` writes matrices as
such files; ``flower_vfl.io.data`` loads the bundled datasets (a9a, breast_cancer) and splits
their columns (``write_bundled`` writes them as party files).
"""

from flower_vfl.io.preprocess import Preprocessor
from flower_vfl.io.sources import DataError, PartyTable, SourceConfig, align_rows, read_party, source_from_config

__all__ = ["DataError", "PartyTable", "Preprocessor", "SourceConfig", "align_rows", "read_party",
           "source_from_config"]
