"""Fully-asynchronous training: a streaming rollouter, a bounded queue and the trainer loop."""

from asyncrl.recipes.fully_async.trainer import FullyAsyncRecipe

__all__ = ["FullyAsyncRecipe"]
