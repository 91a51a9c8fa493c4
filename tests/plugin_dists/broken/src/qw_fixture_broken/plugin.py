"""A plugin whose import fails, as when a native dependency is missing."""

raise ImportError("libbackend.so: cannot open shared object file")
