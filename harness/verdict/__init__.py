"""Verdicts: the expectations file and how a result counts under it (`expectations`), and recorded
results judged again under it, entry by entry (`audit`).  Imports only the model and the base."""
