"""A federation's own data: one file = one site (device), named by its file stem.

The wing, in the order the data flows: a site's rows enter in
:mod:`~fedclust.sites.files_in`; :mod:`~fedclust.sites.schema` and
:mod:`~fedclust.sites.schema_round` fix the federation's columns, categories and
labels; :mod:`~fedclust.sites.federation` makes the federation ``fedclust run``
fits; :mod:`~fedclust.sites.preprocess` imputes and scales in one counted round;
:mod:`~fedclust.sites.transform` (in process and on Flower's simulation) and
:mod:`~fedclust.sites.deployed` (a deployed app) run any family's protocol on
rows each site encodes and preprocesses itself, with
:mod:`~fedclust.sites.algorithm` building the configured algorithm's protocol
for a schema; labels and the model leave in :mod:`~fedclust.sites.files_out`
(``labels/<site>.csv``, ``model.npz``). Families are reached only through
:mod:`fedclust.core.registry`.

:func:`load_sites` reads CSV (``.csv``, ``.csv.gz``, ``.tsv``), Parquet
(``.parquet``, ``.pq``) and ``.npz`` files (``allow_pickle=False``; ``X`` with
optional ``feature_names`` and any 1-D arrays of the same length, such as
``y``), or one table split into sites by a column (:func:`load_table_sites`).
CSV and Parquet need pandas (and pyarrow for Parquet): ``pip install
'fedclust[io]'``; ``.npz`` needs nothing more than numpy.

What crosses sites here is what a federated schema round would carry: each
site's column names and, for categorical columns, the set of categories it
holds. The server's union of those sets (:func:`union_categories`) fixes the
one-hot columns, so every site encodes its rows identically without sending
one. The same :class:`SiteSchema` encodes a new site's file at prediction time
(:func:`encode_table`), so a saved model applies the training encoding.

Missing values (empty cells, ``NA``, ``?``, NaN) stay NaN in the numeric
columns; a missing categorical value is NaN in all of its indicator columns, so
mean imputation fills it with the pooled category frequencies. Federated
imputation and scaling are :class:`fedclust.sites.preprocess.FederatedPreprocessor`.
"""

from .federation import (SiteFederation, SiteInfo, as_values, files_source, load_sites,
                         load_table_sites, site_paths, site_request, table_source, to_federation)
from .schema import (SiteSchema, encode_table, label_indices, label_values, site_categories,
                     union_categories)
from .files_in import NA_VALUES, RawTable, expand_paths, file_stem, frame_columns, read_table

__all__ = ["SiteFederation", "SiteInfo", "SiteSchema", "RawTable", "load_sites",
           "load_table_sites", "read_table", "encode_table", "union_categories",
           "site_categories", "label_values", "label_indices", "expand_paths", "file_stem",
           "frame_columns", "to_federation", "files_source", "table_source", "as_values",
           "NA_VALUES", "site_request", "site_paths"]
