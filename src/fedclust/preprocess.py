"""The federated preprocessing's import path for users: it lives in the site wing,
:mod:`fedclust.sites.preprocess` (pooled mean imputation and scaling in one counted round).
"""

from .sites.preprocess import (IMPUTE, PREPROCESS_BUDGET_SHARE, SCALE, ColumnMoments,  # noqa: F401
                               FederatedPreprocessor, PooledTransform, PreprocessProtocol,
                               PreprocessResult, check_no_missing)

__all__ = ["FederatedPreprocessor", "PreprocessProtocol", "PreprocessResult", "ColumnMoments",
           "PooledTransform", "IMPUTE", "SCALE", "PREPROCESS_BUDGET_SHARE", "check_no_missing"]
