"""The coefficients written out in tppasm.approx are the fits of its ``_fit_*`` functions (fitted
again here: a change of either shows)."""
import numpy as np
import pytest

from tppasm import approx


@pytest.mark.parametrize("name, fit", [
    ("TANH_POLY", lambda: approx._fit_tanh()),
    ("ERFC_POLY", lambda: approx._fit_erfc()),
    ("HALF_ERFC_POLY_BF16", lambda: approx._fit_erfc(5, mid=0.0, halve=True)),
    ("EXP_POLY", lambda: approx._fit_exp(6)),
    ("EXP_POLY_BF16", lambda: approx._fit_exp(4))])
def test_polynomials_are_their_fits(name, fit):
    """Within 2^-24, under float32's step (the kernels take them as float32): a fit on another
    BLAS moves its last float64 digits (TANH_POLY's first by 2.7e-9 relative on a Zen 3)."""
    np.testing.assert_allclose(getattr(approx, name), fit(), rtol=2 ** -24, atol=1e-15)


@pytest.mark.parametrize("name, args", [("GELU_TABLE_16", (16, 6.0, 5)), ("GELU_TABLE_8", (8, 6.4, 6))])
def test_gelu_tables_are_their_fits(name, args):
    table, fitted = getattr(approx, name), approx._fit_gelu_table(*args)
    assert (table.limit, table.inv_h) == (fitted.limit, fitted.inv_h)
    # float32-rounded coefficients: a refit may land one float32 step away
    np.testing.assert_allclose(np.array(table.rows), np.array(fitted.rows), rtol=2 ** -22, atol=1e-12)
