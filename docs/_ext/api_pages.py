"""Write the API reference pages (``docs/api/``) from the package's ``__all__`` lists.

The public names are those of :mod:`fedclust` and of each wing's ``__all__``; an
object exported in several places is documented once, where it is listed first.
"""

from __future__ import annotations

import importlib
from pathlib import Path

#: (module, heading, one line on what it holds), in page order
SECTIONS = [
    ("fedclust", "Front doors and errors", "The estimators and the exceptions of the package."),
    ("fedclust.kfed", "k-FED", "One-shot federated k-means (Dennis, Li & Smith, ICML 2021)."),
    ("fedclust.lloyd", "k-means baselines", "Naive distributed Lloyd and centralized k-means."),
    ("fedclust.coreset", "Distributed PCA and coresets",
     "Balcan, Ehrlich & Liang 2013; Liang, Balcan, Kanchanapally & Woodruff 2014."),
    ("fedclust.gauss", "Evolving Gaussians", "Federated self-evolving Gaussian clustering and "
     "classification (Ožbot & Škrjanc)."),
    ("fedclust.fl", "Clustered federated learning", "FedAvg, IFCA, k-FED + FedAvg."),
    ("fedclust.robust", "Byzantine-robust clustering",
     "Robust clustering and clustered regression (Ghosh, Hong, Yin & Ramchandran 2019)."),
    ("fedclust.datasets", "Datasets", "Generators and loaders of federations."),
    ("fedclust.sites", "Site files", "One file per site in (CSV, Parquet, npz), the saved model out."),
    ("fedclust.sites.preprocess", "Federated preprocessing",
     "Pooled mean imputation and standard scaling in one counted round."),
    ("fedclust.privacy", "Differential privacy",
     "Clipping, discrete Gaussian noise (OpenDP), the accountant (dp-accounting) and the "
     "privacy audit behind ``privacy=``."),
    ("fedclust.metrics", "Metrics", "Clustering accuracy and cost."),
    ("fedclust.sim", "Simulation", "The in-process transport, faults, Byzantine devices and the "
     "byte meter."),
    ("fedclust.config", "Configurations", "Read and check the TOML configuration of an experiment."),
    ("fedclust.experiment", "Experiments", "Run a configuration from Python, as ``fedclust run`` "
     "does."),
    ("fedclust.core.registry", "Registry", "What a family registers so that the command line, "
     "the configurations and the Flower apps serve it."),
    ("fedclust.core.policy", "Device policy", "What a device enforces whatever the server "
     "asks: secure-aggregation mode, group minimum, allowed actions, its own privacy ledger."),
    ("fedclust.flower", "Flower", "The same protocols on Flower: the simulation and in-memory "
     "transports and the ServerApp/ClientApp factories (needs the ``flower`` extra)."),
]


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    return [n for n in getattr(module, "__all__", []) if not n.startswith("_")]


def write_api_pages(folder: Path) -> Path:
    """Write ``folder/index.rst`` (autosummary tables); returns its path."""
    seen: set[int] = set()
    pages: set[str] = set()
    lines = ["API reference", "=============", "",
             "Every public class and function, generated from the docstrings. "
             "Shapes use ``n`` points, ``d`` features, ``k`` clusters and ``Z`` devices.", ""]
    for module_name, heading, blurb in SECTIONS:
        module = importlib.import_module(module_name)
        names = []
        for name in public_names(module_name):
            obj = getattr(module, name)
            if id(obj) in seen or not callable(obj):
                continue
            seen.add(id(obj))
            names.append(name)
            pages.add(f"{module_name}.{name}.rst")
        if not names:
            continue
        lines += [heading, "-" * len(heading), "", blurb, "",
                  f".. currentmodule:: {module_name}", "", ".. autosummary::",
                  "   :toctree: generated", "", *(f"   {n}" for n in names), ""]
    folder.mkdir(parents=True, exist_ok=True)
    # a generated page of a name that is not public would sit outside the toctree
    for old in (folder / "generated").glob("*.rst"):
        if old.name not in pages:
            old.unlink()
    path = folder / "index.rst"
    text = "\n".join(lines)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
