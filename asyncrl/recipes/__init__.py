"""Recipes: the training loops of each mode, built from the core's stages."""
