"""The HTTP room: the app factory, the server, the fast path, error mapping, OpenAPI, metrics, logs, the
typed dependencies, and the health, docs and explorer routes. The only room that knows the app."""
