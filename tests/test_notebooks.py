"""Every notebook in notebooks/ runs from top to bottom without an error (as ``pytest --nbmake
notebooks/`` would), and none is committed with outputs."""
import os
import pathlib
import sys

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    stale = [i for i, c in enumerate(book.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not stale, f"{path.name}: cells {stale} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, monkeypatch, tmp_path):
    # the kernel runs this interpreter (the one with tppasm installed), in the notebook's folder
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("HYPOTHESIS_STORAGE_DIRECTORY", str(tmp_path / ".hypothesis"))     # not in notebooks/
    book = nbformat.read(path, as_version=4)
    NotebookClient(book, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
