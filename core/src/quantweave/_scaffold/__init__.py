"""Templates of the plugin project ``quantweave new-plugin`` generates (package data,
rendered by :mod:`quantweave.scaffold` with :class:`string.Template`)."""
