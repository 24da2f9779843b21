"""What every feature room's routes share, below them all: bounded request bodies (`bodies`), the typed
dependencies that reach the app's state (`deps`), responses that hold memory until sent (`sending`), the
restricted API's groups (`restricted`) and the Unix listener's peer identity (`unix`)."""
