"""Generated site files for the site-data tests (pandas writes CSV/Parquet into tmp_path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_sites(tmp_path: Path, *, n_sites: int = 3, fmt: str = "csv", seed: int = 0,
                missing: float = 0.15, sizes=(40, 55, 30, 47)) -> tuple[list[Path], dict]:
    """Sites with two well-separated groups, numeric NaNs, a categorical column and string labels.

    Returns the paths and the pooled truth (frames in site order).
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    paths, frames = [], []
    for s in range(n_sites):
        n = sizes[s % len(sizes)]
        g = rng.integers(0, 2, n)
        df = pd.DataFrame({
            "pid": [f"s{s}-{i}" for i in range(n)],
            "age": 40 + 25 * g + rng.normal(0, 3, n),
            "chol": 180 + 80 * g + rng.normal(0, 10, n),
            "bp": 120 + 0.5 * rng.normal(0, 8, n),
            "smoker": rng.choice(["no", "yes", "former"][: 2 + (s % 2)], n),
            "diagnosis": np.where(g == 1, "sick", "healthy"),
        })
        for c in ("age", "chol", "bp"):
            df.loc[rng.random(n) < missing, c] = np.nan
        path = tmp_path / f"site{s}.{fmt}"
        if fmt == "csv":
            df.to_csv(path, index=False)
        else:
            df.to_parquet(path, index=False)
        paths.append(path)
        frames.append(df)
    return paths, {"frames": frames}
