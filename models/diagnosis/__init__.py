"""Check a ported table against the reference: agreement figures, and the known mistakes that explain
a difference, each rebuilt as the table it would produce (pure numpy; docs/ENCODINGS.md "Check my port")."""
