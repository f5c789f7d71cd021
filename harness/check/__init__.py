"""Checking: what a run recorded (`records`) and the oracles that compare two runs bit for bit
(`oracles`, `compare`, `streams`, `ambient`, `reference`).  Imports only the model and the base."""
