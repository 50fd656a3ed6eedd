"""Fixture (sandbox): leaves the interpreter at once with exit code 3, no cleanup, no report."""
import os

os._exit(3)
