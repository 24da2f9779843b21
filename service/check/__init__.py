"""Checks of a user's tensors against the golden tables and the models: agreement figures and a diagnosis."""
