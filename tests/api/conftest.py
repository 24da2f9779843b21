"""The HTTP surface through TestClient: tables, properties, check, wire formats, errors, caching, the CLI."""
