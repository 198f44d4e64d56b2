"""Flax (linen) models. Parameters are plain pytrees with documented paths (see each module)."""
