"""analysis/catalog.py reads each figure's ORDER, COST, READS and caption from its source, without importing it:
the same values the imported module (analysis.figures.FIGURES) has, for every figure."""
from __future__ import annotations

import pytest

from analysis.catalog import Info, figures


def test_catalog_matches_the_imported_figures():
    from analysis.figures import FIGURES

    info = figures()
    assert list(info) == list(FIGURES)  # the report's order
    for name, fig in FIGURES.items():
        i = info[name]
        caption = (fig.module.__doc__ or name).strip().split("\n\n")[0].replace("\n", " ")
        assert (i.order, i.cost, i.caption) == (fig.module.ORDER, fig.module.COST, caption), name
        assert i.reads == getattr(fig.module, "READS", None), name
        assert i.path == fig.module.__file__, name


def test_a_constant_that_is_not_a_literal_is_refused(tmp_path, monkeypatch):
    import analysis.catalog as catalog

    (tmp_path / "odd_one.py").write_text('"""Odd."""\nORDER = 1 + len("x")\nCOST = 0\n')
    monkeypatch.setattr(catalog, "_where", lambda: [str(tmp_path)])
    catalog.figures.cache_clear()
    try:
        with pytest.raises(ValueError, match="odd_one.py: ORDER must be a literal"):
            catalog.figures()
    finally:
        monkeypatch.undo()
        catalog.figures.cache_clear()
    assert isinstance(figures()["iso-param"], Info)
