"""See edgespec/__init__.py."""
