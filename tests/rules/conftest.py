"""House rules of the code base: import directions, where torch may be imported."""
