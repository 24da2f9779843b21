"""The model presets (`posenc.models.presets`) as routes: the catalogue, one preset, and its tables."""
