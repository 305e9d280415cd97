"""Figure functions (matplotlib, imported lazily; never imported by ``import otspec``).

Every function takes ``ax=None``, draws on the given axes (or a new figure),
returns the axes and never calls ``plt.show()``.
"""
