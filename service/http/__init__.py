"""The assembly: the app factory, the server and its protocol, the fast path, error mapping, OpenAPI,
metrics, logs, and the health, docs and explorer routes. It imports the feature rooms; nothing below it
imports it back (only the CLI, the test kit and the `posenc` entry points do: tests/rules)."""
