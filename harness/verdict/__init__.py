"""Verdicts: the expectations file and how a result counts under it (`expectations`).
Imports only the model and the base."""
