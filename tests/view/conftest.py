"""The ``view`` marker is registered in the root pyproject.toml with the others."""
