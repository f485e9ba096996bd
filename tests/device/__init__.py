"""On-device tests (pytest -m jetson) and their CPU stand-ins.

A package, so that its conftest.py does not shadow tests/conftest.py as module `conftest`.
"""
