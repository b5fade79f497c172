"""The one exception of the estimator: bad input, with a message naming the problem and the fix."""


class EstimateError(ValueError):
    """An input the estimator cannot use (unknown platform, a plan that does not divide the model,
    a malformed price file...); the message says what to change."""
