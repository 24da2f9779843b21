"""One router per feature."""
