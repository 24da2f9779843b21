"""Properties of position encodings, measured on the tables posenc serves (docs/properties.md).

Pure numpy functions of plain parameters and tables: uniqueness (distances between positions' rows,
exact collisions in a served dtype), relative-position awareness (residuals of the identities that
make an encoding relative), norm preservation, long-range decay, extrapolation (wavelengths against
a context length) and permutation equivariance. Everything is float64 unless the measurement is
about a served dtype, which it then names.
"""
