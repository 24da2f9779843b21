"""The numeric core (models/) without torch: shapes, dtypes, and what no reference checks."""
