"""Execute every notebook in notebooks/ in SMALL mode; any cell error fails the test.

Parameters are injected as a new cell right after the cell tagged ``parameters``
(what papermill does), so the committed notebooks stay untouched. The
notebooks use ``../shared/datasets`` (MNIST, UCI tables); they run on the
notebook kernel of the current interpreter (ipykernel).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SMALL_PARAMETERS = {"SMALL": True}
TIMEOUT = 600  # seconds per cell


def inject_parameters(nb, params: dict) -> None:
    """Insert a cell assigning ``params`` after the cell tagged ``parameters``."""
    idx = next((i for i, c in enumerate(nb.cells)
                if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])), None)
    if idx is None:
        raise AssertionError("the notebook has no cell tagged 'parameters'")
    src = "# injected parameters\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(src)
    cell.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(idx + 1, cell)


def execute_notebook(path: Path, params: dict, timeout: int = TIMEOUT):
    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, params)
    env_backend = os.environ.get("MPLBACKEND")
    # the kernel's inline backend embeds the figures as PNG outputs (a headless Agg would not)
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    try:
        client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        if env_backend is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env_backend
    return nb


NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def test_all_four_notebooks_exist():
    names = {p.name for p in NOTEBOOK_FILES}
    for want in ("01_projection.ipynb", "02_dprp.ipynb", "03_kmeans.ipynb", "04_cdr.ipynb"):
        assert want in names, f"notebooks/{want} is missing"


# notebooks that read the real tables of ../shared/datasets (UCI tables, MNIST): skipped, naming the
# folder, on a fresh clone without it (CI has it)
NEEDS_SHARED = {"02_dprp", "03_kmeans", "05_mnist", "06_regression", "07_synthetic"}


def test_notebooks_that_read_the_shared_datasets_are_listed():
    for p in NOTEBOOK_FILES:
        text = p.read_text()
        reads = any(w in text for w in ("shared/datasets", "load_mnist", "dprp_utility", "dpgm_mnist", "MNIST at"))
        assert not reads or p.stem in NEEDS_SHARED, f"{p.name} reads ../shared/datasets: add it to NEEDS_SHARED"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_notebook_runs_in_small_mode(path):
    if path.stem in NEEDS_SHARED:
        from tests.conftest import shared_dataset

        shared_dataset()
    nb = execute_notebook(path, SMALL_PARAMETERS)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    # the notebook must show something: at least one plot
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, f"{path.name} produced no plot in SMALL mode"
