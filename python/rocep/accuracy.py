"""How close two results are, as DeepEP's tests measure it."""

import numpy as np


def calc_diff(x, y) -> float:
    """1 - 2 sum(x y) / sum(x^2 + y^2) = sum((x - y)^2) / sum(x^2 + y^2), in float64: 0 for equal arrays.
    x, y: numpy arrays (or anything numpy converts) of one shape."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())
