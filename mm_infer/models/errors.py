"""Errors raised while reading a checkpoint into our model code."""


class ModelLoadError(Exception):
    """Base class: the checkpoint cannot be turned into a model."""


class UnknownArchitectureError(ModelLoadError):
    """config.json names an architecture or model_type we do not implement."""


class MissingTensorError(ModelLoadError):
    """A parameter of the model has no tensor in the checkpoint."""


class ShapeMismatchError(ModelLoadError):
    """A checkpoint tensor has a different shape than the parameter it maps to."""


class UnexpectedTensorError(ModelLoadError):
    """A checkpoint tensor maps to no parameter of the model."""


class UnsupportedConfigError(ModelLoadError):
    """config.json asks for a feature our model code does not implement (e.g. sliding-window attention)."""
