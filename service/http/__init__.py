"""The HTTP room: the app factory, the server, the fast path, error mapping, OpenAPI, metrics, logs, the
typed dependencies (`deps`), bounded request bodies (`bodies`), and the health, docs and explorer routes.
The only room that knows the app. Other rooms import `deps` and `bodies`: this file imports nothing."""
