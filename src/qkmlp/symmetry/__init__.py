"""The symmetries of the layers: transforms, the dimension of the continuous group, the group.

- :mod:`~qkmlp.symmetry.transforms`: ``swapped`` (q ↔ k), ``rescaled`` (q → αq, k → k/α),
  ``gauge_transformed`` (Q_j → G Q_j, K_j → G⁻ᵀ K_j), ``relative_change``, and the theorems
  of chapter 5 as predicates (``swap_is_symmetry``, ``rescaling_is_symmetry``, ...).
- :mod:`~qkmlp.symmetry.dimensions`: the number of continuous symmetry directions,
  measured (Jacobian rank, ``symmetry_dimension``) and predicted (``symmetry_breakdown``).
- :mod:`~qkmlp.symmetry.group`: the gauge count, the discrete symmetries and the conserved
  quantities of gradient flow.

Every name of the three is importable from here (``from qkmlp.symmetry import swapped``).
Transforms return a new layer and leave their input untouched.
"""
from .dimensions import *  # noqa: F401,F403
from .dimensions import __all__ as _dimensions_all
from .group import *  # noqa: F401,F403
from .group import __all__ as _group_all
from .transforms import *  # noqa: F401,F403
from .transforms import __all__ as _transforms_all

__all__ = [*_transforms_all, *_dimensions_all, *_group_all]
